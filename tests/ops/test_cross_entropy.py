"""label_smoothed_cross_entropy and its linear (chunked projection) form: the fused kernels against
the reference (fairseq's formula), forward and backward."""
import pytest
import torch

from support import device_assert
from support.tensors import CUDA_DEVICES, DEVICE_DTYPES, assert_close, randn
from fairseq_lightseq import ops
from fairseq_lightseq.ops import reference
from fairseq_lightseq.ops.cross_entropy import LabelSmoothedCrossEntropyFunction
from torch.utils._python_dispatch import TorchDispatchMode

PAD = 1
SHAPES = [(1, 7), (13, 7), (9, 129), (5, 32003), (1, 1)]


def _stat(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def _target(n, V, device, seed=0, pad_every=4):
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(0, V, (n,), generator=g)
    if n > 1:
        t[::pad_every] = PAD if V > PAD else 0  # some padding rows (or plain targets when V == 1)
    return t.to(device)


def _run(fn, logits, target, eps, dloss, dnll):
    z = logits.detach().clone().requires_grad_()
    loss, nll = fn(z, target, eps, PAD)
    (loss * dloss + nll * dnll).sum().backward()
    return loss, nll, z.grad


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_forward_backward_match_reference(device, dtype, shape, eps):
    n, V = shape
    logits = randn(n, V, dtype=dtype, device=device, seed=1) * 4
    target = _target(n, V, device)
    dloss = randn(n, dtype=_stat(dtype), device=device, seed=2)
    dnll = randn(n, dtype=_stat(dtype), device=device, seed=3)
    loss, nll, grad = _run(ops.label_smoothed_cross_entropy, logits, target, eps, dloss, dnll)
    # The reference sees the same (rounded) logits, computed in fp32/fp64.
    rl, rn, rg = _run(reference.label_smoothed_cross_entropy, logits, target, eps, dloss, dnll)
    assert loss.dtype == _stat(dtype) and nll.dtype == _stat(dtype) and grad.dtype == dtype
    fp_tol = torch.float64 if dtype == torch.float64 else torch.float32
    assert_close(loss, rl, dtype=fp_tol, scale=10)  # both fp32 math; sums of V terms
    assert_close(nll, rn, dtype=fp_tol, scale=10)
    assert_close(grad, rg, scale=2)
    pad = target.eq(PAD)
    assert torch.all(loss[pad] == 0) and torch.all(nll[pad] == 0) and torch.all(grad[pad] == 0)


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_large_vocab_smoothing_sum_is_accurate(device, dtype):
    """V = 250k: the smoothing sum has no V*lse - sum(z) cancellation (checked against float64)."""
    logits = randn(3, 250_001, dtype=dtype, device=device, seed=4) * 3
    target = torch.tensor([0, 250_000, 77], device=device)
    loss, nll = ops.label_smoothed_cross_entropy(logits, target, 0.1, PAD)
    rl, rn = reference.label_smoothed_cross_entropy(logits.double(), target, 0.1, PAD)
    torch.testing.assert_close(loss.double(), rl, rtol=2e-6, atol=2e-5)
    torch.testing.assert_close(nll.double(), rn, rtol=2e-6, atol=2e-5)


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_all_padding_gives_zero_loss_and_grad(device, dtype):
    logits = (randn(6, 33, dtype=dtype, device=device, seed=5) * 1e4).requires_grad_()
    target = torch.full((6,), PAD, device=device)
    loss, nll = ops.label_smoothed_cross_entropy(logits, target, 0.1, PAD)
    (loss.sum() + nll.sum()).backward()
    assert torch.all(loss == 0) and torch.all(nll == 0)
    assert torch.all(logits.grad == 0) and not torch.isnan(logits.grad).any()


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_only_loss_used_gives_loss_gradient(device, dtype):
    """nll unused (the criterion's case): its gradient is None, treated as zero."""
    logits = randn(7, 129, dtype=dtype, device=device, seed=6)
    target = _target(7, 129, device)
    z = logits.detach().clone().requires_grad_()
    ops.label_smoothed_cross_entropy(z, target, 0.1, PAD)[0].sum().backward()
    zr = logits.detach().clone().requires_grad_()
    reference.label_smoothed_cross_entropy(zr, target, 0.1, PAD)[0].sum().backward()
    assert_close(z.grad, zr.grad, scale=2)


def test_leading_dims_are_flattened():
    logits = randn(2, 3, 11, seed=7)
    target = _target(6, 11, "cpu").view(2, 3)
    loss, nll = ops.label_smoothed_cross_entropy(logits, target, 0.1, PAD)
    rl, rn = reference.label_smoothed_cross_entropy(logits, target, 0.1, PAD)
    assert loss.shape == (2, 3)
    assert_close(loss, rl) and assert_close(nll, rn)


@pytest.mark.parametrize("shape", [(5, 7), (3, 129), (1, 2)])
@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_gradcheck_float64(shape, eps):
    n, V = shape
    logits = randn(n, V, dtype=torch.float64, seed=8).requires_grad_()
    target = _target(n, V, "cpu", pad_every=3)
    assert torch.autograd.gradcheck(lambda z: LabelSmoothedCrossEntropyFunction.apply(z, target, eps, PAD), (logits,))


def test_uses_the_compiled_kernel_on_cpu():
    assert ops.has_kernel("label_smoothed_cross_entropy_fwd", "cpu")
    assert ops.has_kernel("label_smoothed_cross_entropy_bwd", "cpu")


# ---- linear_label_smoothed_cross_entropy (chunked projection + loss) ----

def _linear_inputs(n, d, V, dtype, device, seed=10):
    h = randn(n, d, dtype=dtype, device=device, seed=seed)
    w = randn(V, d, dtype=dtype, device=device, seed=seed + 1) * 0.3
    return h, w, _target(n, V, device, seed=seed + 2, pad_every=5)


def _run_linear(fn, h, w, target, dloss=None, dnll=None, **kw):
    h = h.detach().clone().requires_grad_()
    w = w.detach().clone().requires_grad_()
    loss, nll = fn(h, w, target, 0.1, PAD, **kw)
    if dloss is None:
        (loss.sum() * 3.0).backward()  # a uniform upstream gradient: the stored-gradient path
    else:
        (loss * dloss + nll * dnll).sum().backward()  # per-token gradients: the recompute path
    return loss, nll, h.grad, w.grad


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("chunk", [1, 4, 4096])
@pytest.mark.parametrize("per_token", [False, True])
def test_linear_matches_reference(device, dtype, chunk, per_token):
    n, d, V = 11, 24, 129
    h, w, target = _linear_inputs(n, d, V, dtype, device)
    kw = {}
    if per_token:
        kw = dict(dloss=randn(n, dtype=_stat(dtype), device=device, seed=20),
                  dnll=randn(n, dtype=_stat(dtype), device=device, seed=21))
    out = _run_linear(ops.linear_label_smoothed_cross_entropy, h, w, target, chunk_size=chunk, **kw)
    ref = _run_linear(reference.linear_label_smoothed_cross_entropy, h, w, target, **kw)
    fp_tol = torch.float64 if dtype == torch.float64 else torch.float32
    low = dtype in (torch.float16, torch.bfloat16)
    # low precision: the reference rounds the full logits once, we round chunk by chunk the same way,
    # but the matmuls' accumulation order differs.
    assert_close(out[0], ref[0], dtype=dtype if low else fp_tol, scale=10)
    assert_close(out[1], ref[1], dtype=dtype if low else fp_tol, scale=10)
    assert_close(out[2], ref[2], scale=4)
    assert_close(out[3], ref[3], scale=4 * (n ** 0.5))


def test_linear_gradcheck_float64():
    h, w, target = _linear_inputs(6, 5, 7, torch.float64, "cpu")
    h.requires_grad_()
    w.requires_grad_()
    fn = ops.linear_label_smoothed_cross_entropy
    # per-token gradients (gradcheck's random upstream grads) exercise the recompute path
    assert torch.autograd.gradcheck(lambda h, w: fn(h, w, target, 0.1, PAD, chunk_size=4), (h, w))
    # a scalar sum exercises the stored-gradient path
    assert torch.autograd.gradcheck(lambda h, w: fn(h, w, target, 0.1, PAD, chunk_size=4)[0].sum(), (h, w))


def test_linear_all_padding():
    h, w, _ = _linear_inputs(5, 8, 13, torch.float32, "cpu")
    target = torch.full((5,), PAD)
    loss, nll, dh, dw = _run_linear(ops.linear_label_smoothed_cross_entropy, h, w, target, chunk_size=2)
    assert torch.all(loss == 0) and torch.all(dh == 0) and torch.all(dw == 0)


def test_linear_without_grad_skips_gradient_work():
    h, w, target = _linear_inputs(5, 8, 13, torch.float32, "cpu")
    with torch.no_grad():
        loss, _ = ops.linear_label_smoothed_cross_entropy(h, w, target, 0.1, PAD, chunk_size=2)
    assert_close(loss, reference.linear_label_smoothed_cross_entropy(h, w, target, 0.1, PAD)[0])


# ---- bad input ----

@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: (torch.randn(4, 10), torch.tensor([0, 3, 10, PAD])), r"target\[2\] = 10 is out of range for V = 10"),
        (lambda: (torch.randn(4, 10), torch.tensor([0, -5, 2, PAD])), r"target\[1\] = -5 is out of range for V = 10"),
        (lambda: (torch.randn(4, 10), torch.tensor([0, 1, 2, 3], dtype=torch.int32)), "target must be int64"),
        (lambda: (torch.randn(4, 10), torch.tensor([0, 1, 2])), "target must have shape"),
        (lambda: (torch.randn(4, 10).int(), torch.tensor([0, 1, 2, 3])), "logits must be float32"),
        (lambda: (torch.randn(4, 0), torch.tensor([0, 1, 2, 3])), "V >= 1"),
    ],
)
def test_bad_input_names_the_argument(make, match):
    logits, target = make()
    with pytest.raises(RuntimeError, match=match):
        torch.ops.fairseq_lightseq.label_smoothed_cross_entropy_fwd(logits, target, 0.1, PAD)


_BAD_TARGET_CHILD = """
logits = torch.randn(4, 10, device=DEVICE)
torch.ops.fairseq_lightseq.label_smoothed_cross_entropy_fwd(logits, torch.tensor({target}, device=DEVICE), 0.1, {pad})
if DEVICE == "cuda":
    torch.cuda.synchronize()
print("NO ERROR")
"""


@pytest.mark.parametrize("device", CUDA_DEVICES)
@pytest.mark.parametrize("target,match", [("[0, 3, 10, {pad}]", "target[2] = 10 is out of range for V = 10"),
                                          ("[0, -5, 2, {pad}]", "target[1] = -5 is out of range for V = 10")])
def test_cuda_bad_target_names_the_limit(device, target, match):
    """On CUDA the forward kernel checks the targets (a host check would sync the device on every call): a bad
    target prints the row, the value and V, then fails a device assert (support.device_assert)."""
    failed, out = device_assert.run(_BAD_TARGET_CHILD.format(target=target.format(pad=PAD), pad=PAD), device)
    assert failed and "NO ERROR" not in out, out[-3000:]
    assert match in out, out[-3000:]


def test_bad_epsilon():
    with pytest.raises(RuntimeError, match=r"epsilon must be in \[0, 1\]"):
        ops.label_smoothed_cross_entropy(torch.randn(2, 5), torch.tensor([0, 1]), 1.5, PAD)


def test_linear_bad_input():
    h, w, t = _linear_inputs(4, 8, 13, torch.float32, "cpu")
    with pytest.raises(ValueError, match="chunk_size must be >= 1"):
        ops.linear_label_smoothed_cross_entropy(h, w, t, 0.1, PAD, chunk_size=0)
    with pytest.raises(ValueError, match=r"hidden must be \[N, d\] and weight \[V, d\]"):
        ops.linear_label_smoothed_cross_entropy(h, w[:, :5], t, 0.1, PAD)
    with pytest.raises(RuntimeError, match="out of range for V = 13"):
        ops.linear_label_smoothed_cross_entropy(h, w, torch.tensor([0, 1, 99, 2]), 0.1, PAD)


def test_traces_under_fake_tensors():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        z = torch.empty(6, 50, dtype=torch.bfloat16)
        t = torch.empty(6, dtype=torch.long)
        loss, nll, lse = torch.ops.fairseq_lightseq.label_smoothed_cross_entropy_fwd(z, t, 0.1, PAD)
        dz = torch.ops.fairseq_lightseq.label_smoothed_cross_entropy_bwd(loss, nll, z, t, lse, 0.1, PAD)
    assert loss.shape == (6,) and lse.dtype == torch.float32 and dz.shape == (6, 50) and dz.dtype == torch.bfloat16


# ---- linear_label_smoothed_cross_entropy(reduction="sum"): the criterion's form ----

class _KernelCalls(TorchDispatchMode):
    """Counts the fairseq_lightseq kernels that run (by op name) while active."""

    def __init__(self):
        super().__init__()
        self.calls = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.name()
        if name.startswith("fairseq_lightseq::"):
            key = name.split("::")[1]
            self.calls[key] = self.calls.get(key, 0) + 1
        return func(*args, **(kwargs or {}))


def _run_sum(fn, h, w, target, eps, upstream=3.0, **kw):
    """(loss_sum, nll_sum, argmax, dh, dw) after (loss_sum * upstream).backward()."""
    h = h.detach().clone().requires_grad_()
    w = w.detach().clone().requires_grad_()
    loss, nll, argmax = fn(h, w, target, eps, PAD, reduction="sum", return_argmax=True, **kw)
    (loss * upstream).backward()
    return loss, nll, argmax, h.grad, w.grad


def _unfused_sum(h, w, target, eps, ignore_index, reduction, return_argmax):
    """What the criterion computed before: F.linear, then the fused loss op on the full logits."""
    assert reduction == "sum" and return_argmax
    logits = torch.nn.functional.linear(h, w)
    loss, nll = ops.label_smoothed_cross_entropy(logits, target, eps, ignore_index)
    return loss.sum(), nll.sum(), logits.argmax(1)


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("n,chunk", [(11, 4), (11, 1), (11, None), (1, None), (1, 3)])
@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_linear_sum_matches_reference_and_unfused(device, dtype, n, chunk, eps):
    d, V = 24, 129
    h, w, target = _linear_inputs(n, d, V, dtype, device)
    out = _run_sum(ops.linear_label_smoothed_cross_entropy, h, w, target, eps, chunk_size=chunk)
    low = dtype in (torch.float16, torch.bfloat16)
    fp_tol = torch.float64 if dtype == torch.float64 else torch.float32
    for expected_fn in (reference.linear_label_smoothed_cross_entropy, _unfused_sum):
        ref = _run_sum(expected_fn, h, w, target, eps)
        assert out[0].dtype == ref[0].dtype == _stat(dtype) and out[0].dim() == 0
        assert_close(out[0], ref[0], dtype=dtype if low else fp_tol, scale=10 * n)  # a sum of n rows
        assert_close(out[1], ref[1], dtype=dtype if low else fp_tol, scale=10 * n)
        assert torch.equal(out[2], ref[2])
        assert out[3].dtype == dtype and out[4].dtype == dtype
        assert_close(out[3], ref[3], scale=4 * 3)  # the upstream 3 scales the gradients
        assert_close(out[4], ref[4], scale=4 * 3 * (n ** 0.5))
    if n > 1:  # padding rows: no gradient into their features
        pad = target.eq(PAD)
        assert pad.any() and torch.all(out[3][pad] == 0) and torch.all(out[3][~pad] != 0)


def test_linear_sum_gradcheck_float64():
    h, w, target = _linear_inputs(6, 5, 7, torch.float64, "cpu")
    h.requires_grad_()
    w.requires_grad_()
    fn = ops.linear_label_smoothed_cross_entropy
    for eps in (0.0, 0.1):
        assert torch.autograd.gradcheck(lambda h, w: fn(h, w, target, eps, PAD, chunk_size=4, reduction="sum")[0],
                                        (h, w))


def test_linear_sum_gradient_computed_in_forward():
    """The backward kernel runs once per chunk during forward (dloss = 1 per row), never in backward;
    nll_sum carries no gradient and argmax is an int64 row index."""
    h, w, target = _linear_inputs(11, 8, 13, torch.float32, "cpu")
    h.requires_grad_()
    w.requires_grad_()
    with _KernelCalls() as fwd:
        loss, nll, argmax = ops.linear_label_smoothed_cross_entropy(h, w, target, 0.1, PAD, chunk_size=4,
                                                                    reduction="sum", return_argmax=True)
    assert fwd.calls == {"label_smoothed_cross_entropy_fwd": 3, "label_smoothed_cross_entropy_bwd": 3}
    assert loss.requires_grad and not nll.requires_grad and argmax.dtype == torch.int64
    with _KernelCalls() as bwd:
        loss.backward()
    assert bwd.calls == {}


def test_linear_sum_saves_only_the_gradients():
    """What backward keeps: dhidden [N, d] and dweight [V, d] (fp32 for bf16 inputs), no [rows, V] logits
    nor the inputs (neither saved nor held as ctx attributes, which the saved-tensor hooks do not see)."""
    n, d, V = 11, 8, 13
    for dtype in (torch.float32, torch.bfloat16):
        h, w, target = _linear_inputs(n, d, V, dtype, "cpu")
        h.requires_grad_()
        w.requires_grad_()
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            loss, _ = ops.linear_label_smoothed_cross_entropy(h, w, target, 0.1, PAD, chunk_size=4, reduction="sum")
        assert sorted((tuple(t.shape), t.dtype) for t in saved) == [((n, d), torch.float32), ((V, d), torch.float32)]
        attrs = [v for a in vars(loss.grad_fn).values() for v in (a if isinstance(a, (tuple, list)) else (a,))]
        assert not any(isinstance(v, torch.Tensor) for v in attrs)  # nothing kept as a ctx attribute either
        saved.clear()
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            _unfused_sum(h, w, target, 0.1, PAD, "sum", True)
        assert ((n, V), dtype) in [(tuple(t.shape), t.dtype) for t in saved]  # what the fusion removes


@pytest.mark.parametrize("upstream", [1.0, 0.25])
def test_linear_sum_backward_scales_the_saved_gradients_in_place(upstream):
    """fp32: backward hands on the saved [V, d] gradient itself, scaled in place, so no fresh [V, d]
    tensor per step; the values still match the reference."""
    h, w, target = _linear_inputs(11, 8, 13, torch.float32, "cpu")
    saved = []
    # only the addresses: a reference held here would make autograd copy the gradient into .grad
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.data_ptr()) or t, lambda t: t):
        out = _run_sum(ops.linear_label_smoothed_cross_entropy, h, w, target, 0.1, upstream=upstream, chunk_size=4)
    ref = _run_sum(reference.linear_label_smoothed_cross_entropy, h, w, target, 0.1, upstream=upstream)
    assert_close(out[3], ref[3], scale=4)
    assert_close(out[4], ref[4], scale=4 * 11 ** 0.5)
    assert set(saved) == {out[3].data_ptr(), out[4].data_ptr()}


def test_linear_sum_backward_with_a_kept_graph_leaves_the_saved_gradients():
    """retain_graph=True: a second backward gives the same gradients (the first did not scale in place)."""
    h, w, target = _linear_inputs(11, 8, 13, torch.float32, "cpu")
    h.requires_grad_()
    loss, _ = ops.linear_label_smoothed_cross_entropy(h, w, target, 0.1, PAD, reduction="sum")
    (first,) = torch.autograd.grad(loss * 0.5, h, retain_graph=True)
    (second,) = torch.autograd.grad(loss * 0.5, h)
    assert torch.equal(first, second)


def test_linear_without_grad_runs_no_gradient_kernel():
    """no_grad (validation) with inputs that require grad: only the loss, chunk by chunk."""
    h, w, target = _linear_inputs(11, 8, 13, torch.float32, "cpu")
    h.requires_grad_()
    w.requires_grad_()
    for reduction in ("sum", "none"):
        with torch.no_grad(), _KernelCalls() as calls:
            loss, nll, argmax = ops.linear_label_smoothed_cross_entropy(h, w, target, 0.1, PAD, chunk_size=4,
                                                                        reduction=reduction, return_argmax=True)
        assert calls.calls == {"label_smoothed_cross_entropy_fwd": 3}
        ref = reference.linear_label_smoothed_cross_entropy(h.detach(), w.detach(), target, 0.1, PAD,
                                                            reduction=reduction, return_argmax=True)
        assert not loss.requires_grad
        assert_close(loss, ref[0], scale=10)
        assert_close(nll, ref[1], scale=10)
        assert torch.equal(argmax, ref[2])


def test_linear_default_chunk_follows_the_element_budget(monkeypatch):
    """Without chunk_size: CHUNK_ELEMENTS // V rows per chunk (at least 1); N = 11 rows in chunks of 4
    (not a multiple), then in chunks of one row when V exceeds the budget."""
    from fairseq_lightseq.ops import cross_entropy

    h, w, target = _linear_inputs(11, 8, 13, torch.float32, "cpu")
    ref = _run_sum(reference.linear_label_smoothed_cross_entropy, h, w, target, 0.1)
    for budget, chunks in ((4 * 13 + 5, 3), (5, 11)):
        monkeypatch.setattr(cross_entropy, "CHUNK_ELEMENTS", budget)
        with _KernelCalls() as calls:
            out = _run_sum(ops.linear_label_smoothed_cross_entropy, h, w, target, 0.1)
        assert calls.calls["label_smoothed_cross_entropy_fwd"] == chunks
        for a, b in zip(out, ref):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_linear_sum_all_padding():
    h, w, _ = _linear_inputs(5, 8, 13, torch.float32, "cpu")
    loss, nll, _, dh, dw = _run_sum(ops.linear_label_smoothed_cross_entropy, h, w, torch.full((5,), PAD), 0.1,
                                    chunk_size=2)
    assert loss == 0 and nll == 0 and torch.all(dh == 0) and torch.all(dw == 0)


def test_linear_bad_reduction():
    h, w, t = _linear_inputs(4, 8, 13, torch.float32, "cpu")
    with pytest.raises(ValueError, match=r"reduction must be one of \('none', 'sum'\), got 'mean'"):
        ops.linear_label_smoothed_cross_entropy(h, w, t, 0.1, PAD, reduction="mean")


# ---- linear_label_smoothed_cross_entropy(bias=...): RoBERTa's LM head projects with a bias ----

def _run_biased(fn, h, w, b, target, reduction, dloss=None, **kw):
    """(loss, nll, dh, dw, db) of fn(h, w, target, bias=b) after a uniform (x3) or per-token upstream grad."""
    h, w, b = (x.detach().clone().requires_grad_() for x in (h, w, b))
    loss, nll = fn(h, w, target, 0.1, PAD, reduction=reduction, bias=b, **kw)
    (loss.sum() * 3.0 if dloss is None else (loss * dloss).sum()).backward()
    return loss, nll, h.grad, w.grad, b.grad


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("reduction,per_token", [("sum", False), ("none", False), ("none", True)])
@pytest.mark.parametrize("chunk", [4, None])
def test_linear_bias_matches_reference(device, dtype, reduction, per_token, chunk):
    n, d, V = 11, 24, 129
    h, w, target = _linear_inputs(n, d, V, dtype, device)
    b = randn(V, dtype=dtype, device=device, seed=30)
    dloss = randn(n, dtype=_stat(dtype), device=device, seed=31) if per_token else None
    out = _run_biased(ops.linear_label_smoothed_cross_entropy, h, w, b, target, reduction, dloss, chunk_size=chunk)
    ref = _run_biased(reference.linear_label_smoothed_cross_entropy, h, w, b, target, reduction, dloss)
    low = dtype in (torch.float16, torch.bfloat16)
    fp_tol = torch.float64 if dtype == torch.float64 else torch.float32
    scale = 10 * n if reduction == "sum" else 10
    assert_close(out[0], ref[0], dtype=dtype if low else fp_tol, scale=scale)
    assert out[4].dtype == dtype
    assert_close(out[2], ref[2], scale=4 * 3)
    assert_close(out[3], ref[3], scale=4 * 3 * (n ** 0.5))
    assert_close(out[4], ref[4], scale=4 * 3 * (n ** 0.5))  # a column sum over n rows


def test_linear_bias_gradcheck_float64():
    h, w, target = _linear_inputs(6, 5, 7, torch.float64, "cpu")
    b = randn(7, dtype=torch.float64, seed=32)
    h, w, b = (x.requires_grad_() for x in (h, w, b))
    fn = ops.linear_label_smoothed_cross_entropy
    # per-token upstream gradients (the recompute path), a scalar sum (stored gradients), reduction="sum"
    assert torch.autograd.gradcheck(lambda h, w, b: fn(h, w, target, 0.1, PAD, chunk_size=4, bias=b), (h, w, b))
    assert torch.autograd.gradcheck(lambda h, w, b: fn(h, w, target, 0.1, PAD, chunk_size=4, bias=b)[0].sum(),
                                    (h, w, b))
    for eps in (0.0, 0.1):
        assert torch.autograd.gradcheck(
            lambda h, w, b: fn(h, w, target, eps, PAD, chunk_size=4, reduction="sum", bias=b)[0], (h, w, b))


def test_linear_bias_without_grad_and_empty_rows():
    h, w, target = _linear_inputs(9, 8, 13, torch.float32, "cpu")
    b = randn(13, seed=33)
    with torch.no_grad():
        loss, _ = ops.linear_label_smoothed_cross_entropy(h, w, target, 0.1, PAD, chunk_size=2, bias=b)
    assert_close(loss, reference.linear_label_smoothed_cross_entropy(h, w, target, 0.1, PAD, bias=b)[0])
    # no rows at all (a masked-LM batch without masked tokens): zero loss, zero gradients
    loss, nll, dh, dw, db = _run_biased(ops.linear_label_smoothed_cross_entropy, h[:0], w, b, target[:0], "sum")
    assert loss == 0 and nll == 0 and dh.shape == (0, 8) and torch.all(dw == 0) and torch.all(db == 0)


def test_linear_bad_bias():
    h, w, t = _linear_inputs(4, 8, 13, torch.float32, "cpu")
    with pytest.raises(ValueError, match=r"bias must be \[13\]"):
        ops.linear_label_smoothed_cross_entropy(h, w, t, 0.1, PAD, bias=torch.zeros(12))
    with pytest.raises(ValueError, match=r"bias must be \[13\] of weight's dtype"):
        ops.linear_label_smoothed_cross_entropy(h, w, t, 0.1, PAD, bias=torch.zeros(13, dtype=torch.float64))
