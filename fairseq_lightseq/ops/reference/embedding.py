"""Token + position embedding with fairseq's position semantics."""
__all__ = ["make_positions", "embedding"]

from typing import Optional

import torch

from .philox import dropout


def make_positions(tokens: torch.Tensor, padding_idx: int) -> torch.Tensor:
    """fairseq's utils.make_positions: non-pad tokens numbered padding_idx+1, +2, ... along each row
    (so left and right padding both work); pad tokens get padding_idx. tokens: [B, T] int64."""
    mask = tokens.ne(padding_idx).long()
    return torch.cumsum(mask, dim=1) * mask + padding_idx


def embedding(tokens: torch.Tensor, weight: torch.Tensor, pos_weight: Optional[torch.Tensor],
              padding_idx: int, scale: float = 1.0, p: float = 0.0, seed: int = 0, offset: int = 0,
              positions: Optional[torch.Tensor] = None, rows: Optional[torch.Tensor] = None) -> torch.Tensor:
    """dropout(scale * weight[tokens] + pos_weight[positions]) -> [B, T, E]; pad tokens give zeros.

    tokens: [B, T] int64; weight: [V, E]; pos_weight: [P, E] (sinusoidal table or learned) or None;
    positions: [B, T] int64, default make_positions(tokens, padding_idx). Math in fp32 (fp64).
    The dropout draws over the flat [B, T, E] index from offset, or with rows (int64 [B*T]) over the
    B*T rows of E: element (r, e) of row r = b*T + t draws offset + rows[r] * E + e.
    """
    acc = torch.float64 if weight.dtype == torch.float64 else torch.float32
    x = weight[tokens].to(acc) * scale
    if pos_weight is not None:
        if positions is None:
            positions = make_positions(tokens, padding_idx)
        x = x + pos_weight[positions].to(acc)
    x = x * tokens.ne(padding_idx).unsqueeze(-1).to(acc)
    return dropout(x, p, seed, offset, rows).to(weight.dtype)
