"""Differentiable token + position embedding with dropout."""
from typing import Optional

import torch

from . import _backend, reference
from .dropout import _draw


def embedding(tokens: torch.Tensor, weight: torch.Tensor, pos_weight: Optional[torch.Tensor], padding_idx: int,
              scale: float = 1.0, p: float = 0.0, training: bool = True,
              positions: Optional[torch.Tensor] = None) -> torch.Tensor:
    """dropout(scale * weight[tokens] + pos_weight[positions]) -> [B, T, E]; pad tokens give zeros.
    tokens: [B, T] int64; weight: [V, E]; pos_weight: [P, E] or None; positions: [B, T] int64
    (default: fairseq's make_positions). Gradients flow to weight and pos_weight (if it requires grad)."""
    p, seed = _draw(p, training)
    return reference.embedding(tokens, weight, pos_weight, padding_idx, scale, p, seed, positions=positions)
