"""Differentiable label-smoothed cross entropy (fairseq's formula), optionally fused with the
output projection."""
import torch

from . import _backend, reference


def label_smoothed_cross_entropy(logits: torch.Tensor, target: torch.Tensor, epsilon: float,
                                 ignore_index: int = -100):
    """logits: [N, V] fp32/fp16/bf16; target: [N] int64 -> per-token (loss, nll), fp32 [N], zero at
    ignore_index."""
    return reference.label_smoothed_cross_entropy(logits, target, epsilon, ignore_index)


def linear_label_smoothed_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                                        epsilon: float, ignore_index: int = -100):
    """Same as label_smoothed_cross_entropy(hidden @ weight.T, ...). hidden: [N, d]; weight: [V, d]."""
    return reference.linear_label_smoothed_cross_entropy(hidden, weight, target, epsilon, ignore_index)
