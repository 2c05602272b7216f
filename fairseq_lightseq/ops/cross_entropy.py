"""Differentiable label-smoothed cross entropy (fairseq's formula) over
torch.ops.fairseq_lightseq.label_smoothed_cross_entropy_{fwd,bwd}, and its fusion with the output
projection that never materialises the [N, V] logits.

Formula (see csrc/include/fls/label_smoothing.h): eps_i = eps / (V - 1),
loss = (1 - eps - eps_i) * nll + eps_i * sum_v(-log p_v), per token, zero where target == ignore_index.
"""
__all__ = ["label_smoothed_cross_entropy", "linear_label_smoothed_cross_entropy"]

from typing import Optional

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


# Rows per chunk when the caller gives none: the [rows, V] logits chunk and its gradient stay near
# CHUNK_ELEMENTS elements each (64 MiB in fp32), whatever the vocabulary; at least one row.
CHUNK_ELEMENTS = 1 << 24
# fp16 only: the loss gradient fed to the backward kernel, divided out again in fp32. The kernel writes
# dlogits = dloss * (p - q) in fp16, where values under 2**-14 lose bits and under 2**-24 flush to zero.
# Unfused, fairseq's loss scale reached the kernel as dloss; here the gradient is taken before that
# scale is known (it multiplies in backward), so the op brings its own: 2**8 lifts small probabilities
# while |dlogits| <= 2**8 stays far from fp16's maximum. A power of two: the division is exact.
FP16_GRAD_SCALE = 2.0 ** 8


def _chunk_rows(chunk_size, V):
    return chunk_size if chunk_size is not None else max(1, CHUNK_ELEMENTS // max(V, 1))


_MM_OUT_DTYPE = {}  # (device type, dtype) -> whether torch.mm(..., out_dtype=) works there


def _matmul_acc(a, b, acc):
    """a @ b in `acc` (fp32/fp64): with the GEMM's own fp32 output where torch and the device offer it
    (CUDA fp16/bf16), else from fp32 copies of the operands (CPU bf16; chunk-sized copies)."""
    if a.dtype == acc:
        return a @ b
    key = (a.device.type, a.dtype)
    if _MM_OUT_DTYPE.get(key, a.device.type == "cuda"):
        try:
            out = torch.mm(a, b, out_dtype=acc)
            _MM_OUT_DTYPE[key] = True
            return out
        except (RuntimeError, TypeError):  # no mm.dtype for this torch/device: upcast from now on
            _MM_OUT_DTYPE[key] = False
    return a.to(acc) @ b.to(acc)


def _logits(h, wt, bias):
    """One chunk's logits h @ wt (+ bias), [rows, V] in h's dtype: the bias added by the GEMM (addmm)."""
    return h @ wt if bias is None else torch.addmm(bias, h, wt)


def _chunks(hidden, weight, bias, target, epsilon, ignore_index, rows, want_argmax, want_h, want_w, want_b):
    """The shared chunk loop. Per chunk of `rows` rows: logits_c = hidden_c @ weight.T (+ bias) [rows, V]
    in hidden's dtype, the loss kernel (loss, nll, lse per row), the row argmax when asked, and when a
    gradient is asked the logits gradient of sum(loss) (the backward kernel with dloss = 1 per row,
    FP16_GRAD_SCALE for fp16) turned into dhidden_c = dlogits_c @ weight, dweight += dlogits_c.T @
    hidden_c and dbias += the column sum of dlogits_c. Only one chunk's logits and logits gradient exist
    at a time.

    Returns loss, nll, lse [N] (fp32; fp64 for fp64), argmax [N] int64 or None, and the gradients of
    sum(loss): dhidden [N, d], dweight [V, d] and dbias [V], each fp32 (fp64 for fp64) or None when not
    asked (dbias also when there is no bias)."""
    ops = _backend.ops()
    N = hidden.shape[0]
    stat = _stat_dtype(hidden.dtype)
    want_b = want_b and bias is not None
    loss, nll, lse = (hidden.new_empty((N,), dtype=stat) for _ in range(3))
    argmax = hidden.new_empty((N,), dtype=torch.int64) if want_argmax else None
    dhidden = hidden.new_empty(hidden.shape, dtype=stat) if want_h else None
    # dweight's first chunk writes it (no zero fill of [V, d]); zeros only when there is no chunk
    dweight = (weight.new_empty if N else weight.new_zeros)(weight.shape, dtype=stat) if want_w else None
    dbias = weight.new_zeros(weight.shape[:1], dtype=stat) if want_b else None
    scale = FP16_GRAD_SCALE if hidden.dtype == torch.float16 else 1.0
    wt = weight.t()
    for s in range(0, N, rows):
        e = min(N, s + rows)
        h, t = hidden[s:e], target[s:e]
        z = _logits(h, wt, bias)
        loss[s:e], nll[s:e], lse[s:e] = ops.label_smoothed_cross_entropy_fwd(z, t, epsilon, ignore_index)
        if argmax is not None:
            argmax[s:e] = z.argmax(1)
        if want_h or want_w or want_b:
            dl = torch.full((e - s,), scale, dtype=stat, device=hidden.device)
            dz = ops.label_smoothed_cross_entropy_bwd(dl, torch.zeros_like(dl), z, t, lse[s:e], epsilon,
                                                      ignore_index)
            del z
            if want_h:
                if dz.dtype == stat:
                    torch.matmul(dz, weight, out=dhidden[s:e])
                else:
                    dhidden[s:e] = _matmul_acc(dz, weight, stat)
            if want_w:
                _accumulate(dweight, dz.t(), h, first=s == 0)
            if want_b:
                dbias.add_(dz.sum(0, dtype=stat))
            del dz
    if scale != 1.0:
        for g in (dhidden, dweight, dbias):
            if g is not None:
                g.mul_(1.0 / scale)
    return loss, nll, lse, argmax, dhidden, dweight, dbias


def _accumulate(acc, a, b, first=False):
    """acc += a @ b (first: acc = a @ b, acc's old values unread), acc fp32/fp64 whatever the dtype of a
    and b (fp16/bf16 products in fp32)."""
    if a.dtype == acc.dtype:
        torch.mm(a, b, out=acc) if first else acc.addmm_(a, b)
    else:
        acc.copy_(_matmul_acc(a, b, acc.dtype)) if first else acc.add_(_matmul_acc(a, b, acc.dtype))


def _is_uniform(grad):
    """Whether grad is one value broadcast to every token (the backward of a .sum()): stride 0."""
    return grad.dim() == 0 or grad.numel() <= 1 or grad.stride(0) == 0


def _scaled(grad, c, dtype):
    """grad (fp32/fp64) * c, in `dtype`: the saved gradient of sum(loss) times the upstream one."""
    return (grad * c.to(grad.dtype)).to(dtype)


def _graph_kept() -> bool:
    """Whether the running backward keeps the graph (retain_graph=True), so a saved tensor may be read by
    a later backward; True where this torch cannot tell (torch's AOT autograd asks the same)."""
    kept = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", None)
    return kept is None or kept()


def _scaled_in_place(grad, c, dtype):
    """grad (fp32/fp64, ours to overwrite) *= c, returned in `dtype`. c stays a tensor (no host read)."""
    return grad.mul_(c.to(grad.dtype)).to(dtype)


class LinearLabelSmoothedCrossEntropyFunction(torch.autograd.Function):
    """reduction="none": (hidden [N, d], weight [V, d], bias [V] or None, target [N]) -> per-token
    (loss, nll) [N], and the row argmax [N] int64 of the logits (empty unless asked).

    Forward: `_chunks`, which also computes the gradients of sum(loss) (fp32). Backward: when dloss is a
    single value broadcast over the tokens (loss.sum() or a scaled sum) and nll gets no gradient, it
    scales the stored gradients. Otherwise (any per-token dloss, or a gradient through nll) it
    recomputes the chunks' logits and applies the actual per-token gradients (exact, one more matmul per
    chunk), which is why hidden, weight, bias, target and lse are saved too. The criterion uses
    reduction="sum" (LinearLabelSmoothedCrossEntropySumFunction), which saves only the gradients.
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, target, epsilon, ignore_index, rows, want_argmax):
        loss, nll, lse, argmax, dhidden, dweight, dbias = _chunks(
            hidden, weight, bias, target, epsilon, ignore_index, rows, want_argmax, *ctx.needs_input_grad[:3])
        ctx.save_for_backward(hidden, weight, bias, target, lse, dhidden, dweight, dbias)
        ctx.args = (epsilon, ignore_index, rows)
        ctx.set_materialize_grads(False)
        return loss, nll, argmax if argmax is not None else target.new_empty((0,))

    @staticmethod
    def backward(ctx, dloss, dnll, _dargmax):
        hidden, weight, bias, target, lse, dhidden_1, dweight_1, dbias_1 = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        none = (None,) * 5
        if dloss is None and dnll is None:
            return (None, None, None) + none
        if dnll is None and _is_uniform(dloss):
            c = dloss.reshape(-1)[:1] if dloss.numel() else dloss.new_zeros(1)
            return (_scaled(dhidden_1, c, hidden.dtype) if need_h else None,
                    _scaled(dweight_1, c, weight.dtype) if need_w else None,
                    _scaled(dbias_1, c, bias.dtype) if need_b else None) + none
        # General per-token gradients: recompute each chunk's logits and apply them exactly.
        epsilon, ignore_index, rows = ctx.args
        ops = _backend.ops()
        stat = lse.dtype
        dloss = torch.zeros_like(lse) if dloss is None else dloss.to(stat)
        dnll = torch.zeros_like(lse) if dnll is None else dnll.to(stat)
        dh = torch.empty_like(hidden) if need_h else None
        dw = torch.zeros(weight.shape, dtype=stat, device=weight.device) if need_w else None
        db = torch.zeros(weight.shape[:1], dtype=stat, device=weight.device) if need_b else None
        wt = weight.t()
        for s in range(0, hidden.shape[0], rows):
            e = min(hidden.shape[0], s + rows)
            h = hidden[s:e]
            dz = ops.label_smoothed_cross_entropy_bwd(dloss[s:e], dnll[s:e], _logits(h, wt, bias), target[s:e],
                                                      lse[s:e], epsilon, ignore_index)
            if need_h:
                torch.matmul(dz, weight, out=dh[s:e])
            if need_w:
                _accumulate(dw, dz.t(), h)
            if need_b:
                db.add_(dz.sum(0, dtype=stat))
        return (dh, dw.to(weight.dtype) if need_w else None, db.to(bias.dtype) if need_b else None) + none


class LinearLabelSmoothedCrossEntropySumFunction(torch.autograd.Function):
    """reduction="sum": (hidden [N, d], weight [V, d], bias [V] or None, target [N]) -> (loss_sum,
    nll_sum) scalars (fp32; fp64 for fp64) and the row argmax [N] int64 of the logits (empty unless asked).

    The gradient is computed in forward (`_chunks`) and is the only thing saved: dhidden [N, d], dweight
    [V, d] and dbias [V] in fp32 (fp64 for fp64), never the [N, V] logits, nor hidden or weight. Backward
    returns g * dhidden, g * dweight and g * dbias in the inputs' dtypes, g being loss_sum's gradient (the
    scalar fairseq's loss scaling multiplies in). nll_sum is not differentiable: fairseq only logs it.
    Unless the graph is kept (retain_graph=True, gradcheck), backward scales the saved tensors in place
    and hands them on (fp32 inputs: no copy): a fresh [V, d] tensor per step costs a pass and, on a CPU,
    the page faults of ~V*d*4 new bytes (about as much as the pass again).
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, target, epsilon, ignore_index, rows, want_argmax):
        loss, nll, _, argmax, dhidden, dweight, dbias = _chunks(
            hidden, weight, bias, target, epsilon, ignore_index, rows, want_argmax, *ctx.needs_input_grad[:3])
        ctx.save_for_backward(dhidden, dweight, dbias)
        ctx.dtypes = (hidden.dtype, weight.dtype, weight.dtype)
        nll_sum = nll.sum()
        ctx.mark_non_differentiable(nll_sum)
        return loss.sum(), nll_sum, argmax if argmax is not None else target.new_empty((0,))

    @staticmethod
    def backward(ctx, g, _dnll, _dargmax):
        scale = _scaled if _graph_kept() else _scaled_in_place
        grads = tuple(scale(x, g, dtype) if x is not None else None for x, dtype in zip(ctx.saved_tensors, ctx.dtypes))
        return grads + (None,) * 5


_REDUCTIONS = ("none", "sum")


def linear_label_smoothed_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                                        epsilon: float, ignore_index: int = -100,
                                        chunk_size: Optional[int] = None, reduction: str = "none",
                                        return_argmax: bool = False, bias: Optional[torch.Tensor] = None):
    """Same as label_smoothed_cross_entropy(hidden @ weight.T + bias, target, ...), without materialising the
    [N, V] logits: rows are processed `chunk_size` at a time (default: CHUNK_ELEMENTS // V rows, at
    least 1), and the gradient of the loss is computed in forward, chunk by chunk, while each chunk's
    logits exist.

    hidden: [N, d] (the decoder's features); weight: [V, d] (the output projection's weight), same
    dtype (fp32/fp16/bf16; CPU fp32/fp64/bf16); bias: None or [V], same dtype (RoBERTa's LM head has
    one; each chunk's GEMM adds it, its gradient is the column sum of the chunk's logits gradient);
    target: [N] int64, in [0, V) or ignore_index (those rows add 0 to the loss and to the gradients).
    reduction="none": (loss, nll) [N] float32 (float64 for float64 input), any upstream gradients
    (a uniform one, e.g. of loss.sum(), is served from the gradients computed in forward; per-token
    ones recompute the logits, so hidden and weight stay saved).
    reduction="sum": (loss_sum, nll_sum) 0-dim float32 (float64), the criterion's form: only the
    gradients of hidden and weight are saved for backward, [N, d] + [V, d] fp32, instead of the [N, V]
    logits a projection-then-loss keeps; nll_sum carries no gradient.
    return_argmax: adds a third output, the argmax over V of each row's logits [N] int64 (for
    fairseq's --report-accuracy), found while the chunk exists.
    Without grad mode, or when neither hidden nor weight requires grad, only the loss is computed.
    Precision: logits and their gradient are computed in the input dtype (as F.linear and the loss
    kernel would); the gradients are accumulated and kept in fp32, then cast to each input's dtype in
    backward; fp16 scales the logits gradient by FP16_GRAD_SCALE (divided out in fp32) so that small
    probabilities do not underflow.
    """
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"linear_label_smoothed_cross_entropy: chunk_size must be >= 1, got {chunk_size}")
    if reduction not in _REDUCTIONS:
        raise ValueError(f"linear_label_smoothed_cross_entropy: reduction must be one of {_REDUCTIONS}, "
                         f"got {reduction!r}")
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError("linear_label_smoothed_cross_entropy: hidden must be [N, d] and weight [V, d], got "
                         f"{tuple(hidden.shape)} and {tuple(weight.shape)}")
    if target.shape != hidden.shape[:1]:
        raise ValueError(f"linear_label_smoothed_cross_entropy: target must have shape [{hidden.shape[0]}], got "
                         f"{tuple(target.shape)}")
    if hidden.dtype != weight.dtype or hidden.device != weight.device:
        raise ValueError(f"linear_label_smoothed_cross_entropy: weight ({weight.dtype}, {weight.device}) must match "
                         f"hidden ({hidden.dtype}, {hidden.device})")
    if bias is not None and (bias.shape != weight.shape[:1] or bias.dtype != weight.dtype
                             or bias.device != weight.device):
        raise ValueError(f"linear_label_smoothed_cross_entropy: bias must be [{weight.shape[0]}] of weight's dtype "
                         f"and device, got {tuple(bias.shape)} {bias.dtype} {bias.device}")
    if not _backend.use_kernel(_FWD, hidden.device.type, hidden.dtype):
        return reference.linear_label_smoothed_cross_entropy(hidden, weight, target, epsilon, ignore_index,
                                                             reduction=reduction, return_argmax=return_argmax,
                                                             bias=bias)
    args = (float(epsilon), int(ignore_index), _chunk_rows(chunk_size, weight.shape[0]), bool(return_argmax))
    if torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in (hidden, weight, bias)):
        fn = LinearLabelSmoothedCrossEntropySumFunction if reduction == "sum" else LinearLabelSmoothedCrossEntropyFunction
        out = fn.apply(hidden, weight, bias, target, *args)
    else:  # validation, decoding, a frozen model: the loss alone, chunk by chunk
        loss, nll, _, argmax, *_ = _chunks(hidden, weight, bias, target, *args, False, False, False)
        out = (loss.sum(), nll.sum()) if reduction == "sum" else (loss, nll)
        out += (argmax,)
    return out if return_argmax else out[:2]


@_backend.register_fake(_FWD)
def _fwd_fake(logits, target, epsilon, ignore_index):
    n = logits.shape[0]
    stat = _stat_dtype(logits.dtype)
    return (logits.new_empty((n,), dtype=stat), logits.new_empty((n,), dtype=stat),
            logits.new_empty((n,), dtype=stat))


@_backend.register_fake(_BWD)
def _bwd_fake(dloss, dnll, logits, target, lse, epsilon, ignore_index):
    return torch.empty_like(logits)
