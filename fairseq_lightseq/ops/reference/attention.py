"""Attention probabilities and the head split/merge around the attention GEMMs."""
__all__ = ["AttentionCoords", "attention_softmax_dropout", "attention_dropout", "qkv_bias_split", "merge_heads"]

from typing import NamedTuple, Optional, Sequence, Union

import torch

from .philox import apply_keep, dropout_threshold, keep_bits


class AttentionCoords(NamedTuple):
    """Where a local score block sits in the global problem, for the dropout stream only.

    The local scores [B, H, Tq, Tk] are heads h_off.., queries q_off.. and keys k_off.. of a global
    unpadded [B, H_tot, Tq_tot, Tk_tot]; element (b, h, i, j) draws stream element
        offset + ((b*H_tot + h_off + h)*Tq_tot + q_off + i)*Tk_tot + k_off + j,
    its flat index in the global tensor, so a sliced call (sequence or head parallelism) draws the
    mask of the full call. The default (H, 0, Tq, 0, Tk, 0) gives offset + the local flat index.
    Masks (key padding, causal j > i + Tk - Tq) stay on local indices. Local rows or keys beyond
    Tq_tot / Tk_tot (padding rows) are allowed and draw whatever element the formula gives.
    All six >= 0; H_tot, Tq_tot, Tk_tot >= 1."""

    H_tot: int
    h_off: int
    Tq_tot: int
    q_off: int
    Tk_tot: int
    k_off: int


CoordsArg = Optional[Union[AttentionCoords, Sequence[int]]]


def attention_coords(coords: CoordsArg, shape) -> AttentionCoords:
    """The coordinates of scores of shape [B, H, Tq, Tk]: `coords` checked (ValueError naming
    `coords`), or the default (H, 0, Tq, 0, Tk, 0) for None / empty."""
    _, H, Tq, Tk = shape
    if coords is None or len(coords) == 0:
        return AttentionCoords(H, 0, Tq, 0, Tk, 0)
    if len(coords) != 6:
        raise ValueError("attention_softmax: coords must be 6 ints (H_tot, h_off, Tq_tot, q_off, Tk_tot, k_off), "
                         f"got {len(coords)}: {tuple(coords)}")
    c = AttentionCoords(*(int(v) for v in coords))
    if min(c) < 0 or min(c.H_tot, c.Tq_tot, c.Tk_tot) < 1:
        raise ValueError("attention_softmax: coords must be >= 0 with H_tot, Tq_tot, Tk_tot >= 1, got "
                         f"{tuple(c)}")
    return c


def stream_index(shape, coords: AttentionCoords, offset: int, device=None) -> torch.Tensor:
    """int64 [B, H, Tq, Tk]: the stream element each score draws (AttentionCoords' formula)."""
    B, H, Tq, Tk = shape
    c = coords

    def ar(n, off, dim):
        return (torch.arange(n, dtype=torch.int64, device=device) + off).view([-1 if d == dim else 1 for d in range(4)])

    row = (ar(B, 0, 0) * c.H_tot + ar(H, c.h_off, 1)) * c.Tq_tot + ar(Tq, c.q_off, 2)
    return offset + row * c.Tk_tot + ar(Tk, c.k_off, 3)


def attention_softmax_dropout(scores: torch.Tensor, key_padding_mask: Optional[torch.Tensor] = None,
                              causal: bool = False, scale: float = 1.0, p: float = 0.0, seed: int = 0,
                              offset: int = 0, coords: CoordsArg = None) -> torch.Tensor:
    """dropout(softmax(scale * scores + masks)) over the last dim.

    scores: [B, H, Tq, Tk] float; key_padding_mask: [B, Tk] bool, True at padding (fairseq's
    convention); causal: query i sees keys j <= i + (Tk - Tq) (local indices). A row with every key
    masked gives zeros (never NaN). Dropout: element (b, h, i, j) draws stream element
    offset + its flat index, or its global index under `coords` (AttentionCoords). Math in fp32
    (fp64); result in scores' dtype.
    """
    c = attention_coords(coords, scores.shape)
    acc = torch.float64 if scores.dtype == torch.float64 else torch.float32
    s = scores.to(acc) * scale
    B, H, Tq, Tk = scores.shape
    masked = torch.zeros(B, 1, Tq, Tk, dtype=torch.bool, device=scores.device)
    if key_padding_mask is not None:
        masked = masked | key_padding_mask.view(B, 1, 1, Tk).to(torch.bool)
    if causal:
        i = torch.arange(Tq, device=scores.device).view(Tq, 1)
        j = torch.arange(Tk, device=scores.device).view(1, Tk)
        masked = masked | (j > i + (Tk - Tq)).view(1, 1, Tq, Tk)
    s = s.masked_fill(masked, float("-inf"))
    probs = torch.softmax(s, dim=-1)
    probs = torch.where(masked.all(dim=-1, keepdim=True), torch.zeros_like(probs), probs)
    if dropout_threshold(p) == 0:
        return probs.to(scores.dtype)
    if offset < 0:
        raise ValueError(f"dropout offset must be >= 0, got {offset}")
    keep = keep_bits(stream_index(scores.shape, c, offset, scores.device), p, seed)
    return apply_keep(probs, keep, p).to(scores.dtype)


def attention_dropout(y: torch.Tensor, p: float, seed: int = 0, offset: int = 0,
                      coords: CoordsArg = None) -> torch.Tensor:
    """y * keep / (1 - p) with the mask attention_softmax_dropout draws for scores of y's shape [B, H, Tq, Tk]
    (the same p, seed, offset, coords): its dropped probabilities again from its softmax output y."""
    if dropout_threshold(p) == 0:
        return y
    if offset < 0:
        raise ValueError(f"dropout offset must be >= 0, got {offset}")
    c = attention_coords(coords, y.shape)
    return apply_keep(y, keep_bits(stream_index(y.shape, c, offset, y.device), p, seed), p)


def qkv_bias_split(qkv: torch.Tensor, bias: torch.Tensor, num_heads: int):
    """qkv: [T, B, 3*E] (time-major, as fairseq), bias: [3*E] -> q, k, v each [B*heads, T, E/heads]
    with q[b*heads + h, t, d] = qkv[t, b, h*head_dim + d] + bias[h*head_dim + d] (k, v at +E, +2E)."""
    T, B, E3 = qkv.shape
    E = E3 // 3
    hd = E // num_heads
    acc = torch.float64 if qkv.dtype == torch.float64 else torch.float32
    x = (qkv.to(acc) + bias.to(acc)).to(qkv.dtype)
    x = x.view(T, B, 3, num_heads, hd).permute(2, 1, 3, 0, 4).reshape(3, B * num_heads, T, hd)
    return x[0].contiguous(), x[1].contiguous(), x[2].contiguous()


def merge_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """x: [B*heads, T, head_dim] -> [T, B, heads*head_dim], the inverse of one split."""
    BH, T, hd = x.shape
    B = BH // num_heads
    return x.view(B, num_heads, T, hd).permute(2, 0, 1, 3).reshape(T, B, num_heads * hd)
