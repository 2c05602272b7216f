"""Attention probabilities and the head split/merge around the attention GEMMs."""
from typing import Optional

import torch

from .philox import dropout


def attention_softmax_dropout(scores: torch.Tensor, key_padding_mask: Optional[torch.Tensor] = None,
                              causal: bool = False, scale: float = 1.0, p: float = 0.0, seed: int = 0,
                              offset: int = 0) -> torch.Tensor:
    """dropout(softmax(scale * scores + masks)) over the last dim.

    scores: [B, H, Tq, Tk] float; key_padding_mask: [B, Tk] bool, True at padding (fairseq's
    convention); causal: query i sees keys j <= i + (Tk - Tq). A row with every key masked gives
    zeros (never NaN). Math in fp32 (fp64); result in scores' dtype.
    """
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
    return dropout(probs, p, seed, offset).to(scores.dtype)


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
