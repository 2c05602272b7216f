"""Fused multi-tensor Adam step (fairseq's adam semantics)."""
from typing import List

import torch

from . import _backend, reference


def adam_step(params: List[torch.Tensor], grads: List[torch.Tensor], exp_avgs: List[torch.Tensor],
              exp_avg_sqs: List[torch.Tensor], step: int, lr: float, beta1: float, beta2: float, eps: float,
              weight_decay: float, grad_scale: float = 1.0) -> None:
    """In-place Adam update of fp32 params/state from fp32/fp16/bf16 grads (times grad_scale)."""
    reference.adam_step(params, grads, exp_avgs, exp_avg_sqs, step, lr, beta1, beta2, eps, weight_decay, grad_scale)
