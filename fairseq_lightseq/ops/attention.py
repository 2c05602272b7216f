"""Differentiable attention probabilities (scale + masks + softmax + dropout) and head split/merge."""
from typing import Optional

import torch

from . import _backend, reference
from .dropout import _draw


def attention_softmax_dropout(scores: torch.Tensor, key_padding_mask: Optional[torch.Tensor] = None,
                              causal: bool = False, scale: float = 1.0, p: float = 0.0,
                              training: bool = True) -> torch.Tensor:
    """dropout(softmax(scale * scores + masks)). scores: [B, H, Tq, Tk]; key_padding_mask: [B, Tk]
    bool (True = pad); causal: query i sees keys j <= i + Tk - Tq. All-masked rows give zeros."""
    p, seed = _draw(p, training)
    return reference.attention_softmax_dropout(scores, key_padding_mask, causal, scale, p, seed)


def qkv_bias_split(qkv: torch.Tensor, bias: torch.Tensor, num_heads: int):
    """qkv: [T, B, 3E] + bias [3E] -> (q, k, v), each [B*heads, T, E/heads] contiguous."""
    return reference.qkv_bias_split(qkv, bias, num_heads)


def merge_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """[B*heads, T, head_dim] -> [T, B, E]."""
    return reference.merge_heads(x, num_heads)
