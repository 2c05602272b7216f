"""Adam as fairseq's `adam` optimizer (fairseq/optim/adam.py) applies it, for lists of tensors."""
__all__ = ["adam_step"]

import math
from typing import List

import torch


@torch.no_grad()
def adam_step(params: List, grads: List, exp_avgs: List, exp_avg_sqs: List, step: int, lr: float,
              beta1: float, beta2: float, eps: float, weight_decay: float, grad_scale: float = 1.0) -> None:
    """One in-place update. params, exp_avgs, exp_avg_sqs: fp32 tensors; grads: fp32/fp16/bf16 of the
    same shapes, multiplied by grad_scale first; step: the step number after this update (>= 1).

    fairseq: m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g^2; denom = sqrt(v) + eps;
    step_size = lr * sqrt(1 - b2^step) / (1 - b1^step); p -= wd*lr*p (decoupled, before the step);
    p -= step_size * m / denom.
    """
    bc1 = 1.0 - beta1 ** step
    bc2 = 1.0 - beta2 ** step
    step_size = lr * math.sqrt(bc2) / bc1
    for p, g, m, v in zip(params, grads, exp_avgs, exp_avg_sqs):
        g = g.float() * grad_scale
        m.mul_(beta1).add_(g, alpha=1.0 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1.0 - beta2)
        denom = v.sqrt().add_(eps)
        if weight_decay != 0:
            p.add_(p, alpha=-weight_decay * lr)
        p.addcdiv_(m, denom, value=-step_size)
