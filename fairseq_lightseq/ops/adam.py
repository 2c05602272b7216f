"""Fused multi-tensor Adam step (fairseq's adam semantics) over torch.ops.fairseq_lightseq.adam_step_."""
__all__ = ["adam_step"]

from collections import defaultdict
from typing import List

import torch

from . import _backend, reference

_GRAD_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def kernel_accepts(p, g, m, v) -> bool:
    """Whether the compiled op accepts this tensor quadruple (else it goes to the reference)."""
    return (p.dtype == m.dtype == v.dtype == torch.float32 and g.dtype in _GRAD_DTYPES
            and p.is_contiguous() and m.is_contiguous() and v.is_contiguous()
            and g.device == p.device == m.device == v.device and g.shape == p.shape)


@torch.no_grad()
def adam_step(params: List[torch.Tensor], grads: List[torch.Tensor], exp_avgs: List[torch.Tensor],
              exp_avg_sqs: List[torch.Tensor], step: int, lr: float, beta1: float, beta2: float, eps: float,
              weight_decay: float, grad_scale: float = 1.0) -> None:
    """In-place Adam update, one op call per device over all its tensors.

    params, exp_avgs, exp_avg_sqs: fp32 tensors (any shapes, contiguous for the kernel); grads:
    fp32/fp16/bf16 of the same shapes, multiplied by grad_scale first; step: the step number after
    this update (>= 1). Tensors the kernel cannot take (other dtypes, non-contiguous state, a device
    without a compiled kernel) are updated by the reference, with a one-time warning for the latter.
    """
    if not (len(params) == len(grads) == len(exp_avgs) == len(exp_avg_sqs)):
        raise ValueError(f"adam_step: params, grads, exp_avgs, exp_avg_sqs must have the same length, got "
                         f"{len(params)}, {len(grads)}, {len(exp_avgs)}, {len(exp_avg_sqs)}")
    by_device = defaultdict(lambda: ([], [], [], []))
    rest = ([], [], [], [])
    for quad in zip(params, grads, exp_avgs, exp_avg_sqs):
        if kernel_accepts(*quad) and _backend.use_kernel("adam_step_", quad[0].device.type):
            lists = by_device[quad[0].device]
        else:
            lists = rest
        for lst, t in zip(lists, quad):
            lst.append(t)
    for p, g, m, v in by_device.values():
        _backend.ops().adam_step_(p, g, m, v, int(step), float(lr), float(beta1), float(beta2), float(eps),
                                  float(weight_decay), float(grad_scale))
    if rest[0]:
        reference.adam_step(*rest, step, lr, beta1, beta2, eps, weight_decay, grad_scale)


def adam_step_unchecked(params, grads, exp_avgs, exp_avg_sqs, step: int, lr: float, beta1: float, beta2: float,
                        eps: float, weight_decay: float, grad_scale: float = 1.0) -> None:
    """adam_step for lists the caller has already seen pass kernel_accepts, all on one device with a
    kernel (ls_adam's steady state): the one op call, without the per-tensor sorting."""
    with torch.no_grad():
        _backend.ops().adam_step_(params, grads, exp_avgs, exp_avg_sqs, int(step), float(lr), float(beta1),
                                  float(beta2), float(eps), float(weight_decay), float(grad_scale))


@_backend.register_fake("adam_step_")
def _adam_step_fake(params, grads, exp_avgs, exp_avg_sqs, step, lr, beta1, beta2, eps, weight_decay,
                    grad_scale=1.0):
    return None
