"""Differentiable label-smoothed cross entropy (fairseq's formula) over
torch.ops.fairseq_lightseq.label_smoothed_cross_entropy_{fwd,bwd}, and its fusion with the output
projection that never materialises the [N, V] logits.

Formula (see csrc/include/fls/label_smoothing.h): eps_i = eps / (V - 1),
loss = (1 - eps - eps_i) * nll + eps_i * sum_v(-log p_v), per token, zero where target == ignore_index.
"""
__all__ = ["label_smoothed_cross_entropy", "linear_label_smoothed_cross_entropy"]

import torch

from . import _backend, reference

_FWD = "label_smoothed_cross_entropy_fwd"
_BWD = "label_smoothed_cross_entropy_bwd"


def _stat_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


class LabelSmoothedCrossEntropyFunction(torch.autograd.Function):
    """(logits [N, V], target [N] int64) -> (loss, nll) [N] fp32 (fp64 for fp64 logits).
    Saves logits (the caller's tensor, no copy) and the per-row logsumexp [N] only."""

    @staticmethod
    def forward(ctx, logits, target, epsilon, ignore_index):
        loss, nll, lse = _backend.ops().label_smoothed_cross_entropy_fwd(logits, target, epsilon, ignore_index)
        ctx.save_for_backward(logits, target, lse)
        ctx.epsilon, ctx.ignore_index = epsilon, ignore_index
        ctx.set_materialize_grads(False)  # an unused output (usually nll) costs nothing in backward
        return loss, nll

    @staticmethod
    def backward(ctx, dloss, dnll):
        logits, target, lse = ctx.saved_tensors
        if dloss is None and dnll is None:
            return None, None, None, None
        dloss = torch.zeros_like(lse) if dloss is None else dloss
        dnll = torch.zeros_like(lse) if dnll is None else dnll
        dlogits = _backend.ops().label_smoothed_cross_entropy_bwd(dloss, dnll, logits, target, lse, ctx.epsilon,
                                                                  ctx.ignore_index)
        return dlogits, None, None, None


def label_smoothed_cross_entropy(logits: torch.Tensor, target: torch.Tensor, epsilon: float,
                                 ignore_index: int = -100):
    """Per-token label-smoothed cross entropy with fairseq's formula.

    logits: [N, V] (or [..., V]) fp32/fp16/bf16 (CPU: fp32/fp64/bf16); target: [N] (or [...]) int64,
    each in [0, V) or equal to ignore_index (fairseq passes padding_idx).
    Returns (loss, nll), each [N] (target's shape) float32 (float64 for float64 logits), zero at
    ignore_index. Math in fp32 whatever the logits dtype; the gradient has the logits' dtype.
    """
    if not _backend.use_kernel(_FWD, logits.device.type, logits.dtype):
        return reference.label_smoothed_cross_entropy(logits, target, epsilon, ignore_index)
    if logits.dim() != 2:
        shape = target.shape
        loss, nll = LabelSmoothedCrossEntropyFunction.apply(logits.reshape(-1, logits.shape[-1]), target.reshape(-1),
                                                            float(epsilon), int(ignore_index))
        return loss.view(shape), nll.view(shape)
    return LabelSmoothedCrossEntropyFunction.apply(logits, target, float(epsilon), int(ignore_index))


def _is_uniform(grad):
    """Whether grad is one value broadcast to every token (the backward of a .sum()): stride 0."""
    return grad.dim() == 0 or grad.numel() <= 1 or grad.stride(0) == 0


class LinearLabelSmoothedCrossEntropyFunction(torch.autograd.Function):
    """label_smoothed_cross_entropy(hidden @ weight.T, ...) computed chunk by chunk of rows.

    Forward, per chunk of `chunk_size` rows: logits_c = hidden_c @ weight.T, the loss kernel, and (when
    a gradient is wanted) the logits gradient of sum(loss) straight away, turned into dhidden_c and
    accumulated into dweight (fp32). Only [chunk_size, V] logits (and their gradient) ever exist.
    Backward: when dloss is a single value broadcast over the tokens (loss.sum() or a scaled sum, the
    criterion's case) and nll gets no gradient, it scales the stored gradients. Otherwise (any
    per-token dloss, or a gradient through nll) it recomputes the chunks' logits from the saved lse
    and applies the actual per-token gradients (exact, one more matmul per chunk).
    """

    @staticmethod
    def forward(ctx, hidden, weight, target, epsilon, ignore_index, chunk_size):
        ops = _backend.ops()
        N = hidden.shape[0]
        stat = _stat_dtype(hidden.dtype)
        loss = hidden.new_empty((N,), dtype=stat)
        nll = hidden.new_empty((N,), dtype=stat)
        lse = hidden.new_empty((N,), dtype=stat)
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        dhidden = torch.empty_like(hidden) if need_h else None
        dweight = torch.zeros(weight.shape, dtype=stat, device=weight.device) if need_w else None
        wt = weight.t()
        for s in range(0, N, chunk_size):
            e = min(N, s + chunk_size)
            h, t = hidden[s:e], target[s:e]
            z = h @ wt
            loss[s:e], nll[s:e], lse[s:e] = ops.label_smoothed_cross_entropy_fwd(z, t, epsilon, ignore_index)
            if need_h or need_w:
                ones = torch.ones(e - s, dtype=stat, device=hidden.device)
                dz = ops.label_smoothed_cross_entropy_bwd(ones, torch.zeros_like(ones), z, t, lse[s:e], epsilon,
                                                          ignore_index)
                del z
                if need_h:
                    torch.matmul(dz, weight, out=dhidden[s:e])
                if need_w:
                    _accumulate(dweight, dz.t(), h)
                del dz
        ctx.save_for_backward(hidden, weight, target, lse, dhidden, dweight)
        ctx.args = (epsilon, ignore_index, chunk_size)
        ctx.set_materialize_grads(False)
        return loss, nll

    @staticmethod
    def backward(ctx, dloss, dnll):
        hidden, weight, target, lse, dhidden_1, dweight_1 = ctx.saved_tensors
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        none = (None,) * 4
        if dloss is None and dnll is None:
            return (None, None) + none
        if dnll is None and _is_uniform(dloss):
            c = dloss.reshape(-1)[:1] if dloss.numel() else dloss.new_zeros(1)
            dh = dhidden_1 * c.to(hidden.dtype) if need_h else None
            dw = (dweight_1 * c.to(dweight_1.dtype)).to(weight.dtype) if need_w else None
            return (dh, dw) + none
        # General per-token gradients: recompute each chunk's logits and apply them exactly.
        epsilon, ignore_index, chunk_size = ctx.args
        ops = _backend.ops()
        stat = lse.dtype
        dloss = torch.zeros_like(lse) if dloss is None else dloss.to(stat)
        dnll = torch.zeros_like(lse) if dnll is None else dnll.to(stat)
        dh = torch.empty_like(hidden) if need_h else None
        dw = torch.zeros(weight.shape, dtype=stat, device=weight.device) if need_w else None
        wt = weight.t()
        for s in range(0, hidden.shape[0], chunk_size):
            e = min(hidden.shape[0], s + chunk_size)
            h = hidden[s:e]
            dz = ops.label_smoothed_cross_entropy_bwd(dloss[s:e], dnll[s:e], h @ wt, target[s:e], lse[s:e],
                                                      epsilon, ignore_index)
            if need_h:
                torch.matmul(dz, weight, out=dh[s:e])
            if need_w:
                _accumulate(dw, dz.t(), h)
        return (dh, dw.to(weight.dtype) if need_w else None) + none


def _accumulate(acc, a, b):
    """acc += a @ b, acc in fp32/fp64 whatever the dtype of a and b (fp16/bf16 products are
    rounded once per chunk, then summed in fp32)."""
    if a.dtype == acc.dtype:
        acc.addmm_(a, b)
    else:
        acc.add_(a @ b)


def linear_label_smoothed_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                                        epsilon: float, ignore_index: int = -100, chunk_size: int = 2048):
    """Same as label_smoothed_cross_entropy(hidden @ weight.T, target, ...), without materialising the
    [N, V] logits: rows are processed `chunk_size` at a time.

    hidden: [N, d]; weight: [V, d], same dtype (fp32/fp16/bf16; CPU fp32/fp64/bf16); target: [N] int64.
    Returns (loss, nll) [N] float32 (float64 for float64 input). Peak extra memory is about
    2 * chunk_size * V elements of hidden's dtype plus a [V, d] fp32 weight-gradient accumulator.
    """
    if chunk_size < 1:
        raise ValueError(f"linear_label_smoothed_cross_entropy: chunk_size must be >= 1, got {chunk_size}")
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError("linear_label_smoothed_cross_entropy: hidden must be [N, d] and weight [V, d], got "
                         f"{tuple(hidden.shape)} and {tuple(weight.shape)}")
    if target.shape != hidden.shape[:1]:
        raise ValueError(f"linear_label_smoothed_cross_entropy: target must have shape [{hidden.shape[0]}], got "
                         f"{tuple(target.shape)}")
    if hidden.dtype != weight.dtype or hidden.device != weight.device:
        raise ValueError(f"linear_label_smoothed_cross_entropy: weight ({weight.dtype}, {weight.device}) must match "
                         f"hidden ({hidden.dtype}, {hidden.device})")
    if not _backend.use_kernel(_FWD, hidden.device.type, hidden.dtype):
        return reference.linear_label_smoothed_cross_entropy(hidden, weight, target, epsilon, ignore_index)
    return LinearLabelSmoothedCrossEntropyFunction.apply(hidden, weight, target, float(epsilon), int(ignore_index),
                                                         int(chunk_size))


@_backend.register_fake(_FWD)
def _fwd_fake(logits, target, epsilon, ignore_index):
    n = logits.shape[0]
    stat = _stat_dtype(logits.dtype)
    return (logits.new_empty((n,), dtype=stat), logits.new_empty((n,), dtype=stat),
            logits.new_empty((n,), dtype=stat))


@_backend.register_fake(_BWD)
def _bwd_fake(dloss, dnll, logits, target, lse, epsilon, ignore_index):
    return torch.empty_like(logits)
