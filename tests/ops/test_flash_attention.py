"""Packed attention on torch's flash varlen kernel (ops.flash_attention, ops.blocks.flash_packed_attention).

Without a GPU: the call plumbing under fake CUDA tensors (torch's meta kernels for aten::_flash_attention_forward
/ _backward), recorded by a dispatch mode: for each attention shape (encoder self, causal decoder self, cross with
other key lengths) and dtype, the arguments reach torch's op with the right shapes, dtypes, device, causal flag,
scale, offsets, max lengths and dropout p, and backward passes the forward's saved output, log-sum-exp and rng
state back (with recompute: those of a second forward with the same arguments). The schema check accepts this
torch and refuses changed signatures, and each reason flash cannot run falls back to our kernel with one warning
naming torch's version. CUDA cases (marked `cuda`, run by the GPU check) compare flash with our kernel and the
float64 reference, and check its dropout."""
import warnings

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from support.tensors import assert_close, randn
from fairseq_lightseq import ops
from fairseq_lightseq.modules import multihead_attention
from fairseq_lightseq.ops import _backend, flash_attention, reference
from fairseq_lightseq.ops.blocks import AttentionBlockConfig, flash_packed_attention_block, packed_attention_block
from fairseq_lightseq.ops.blocks.flash_packed_attention import FlashPackedAttentionBlockFunction
from fairseq_lightseq.ops.flash_attention import FlashVarlenAttentionFunction

FWD = torch.ops.aten._flash_attention_forward.default
BWD = torch.ops.aten._flash_attention_backward.default
SCALE = 0.37

# (query lengths, key lengths, causal): encoder self, decoder self (causal), cross (target vs source lengths)
SHAPES = {
    "encoder": ([5, 1, 7], [5, 1, 7], False),
    "decoder": ([4, 1, 6], [4, 1, 6], True),
    "cross": ([3, 6, 1], [5, 2, 7], False),
}
HALF = [torch.float16, torch.bfloat16]


def _cu(lengths, device):
    return torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device=device)


def _offsets(lengths):
    """Fake int32 [B+1] sentence offsets on CUDA (their values stay on the device: the plumbing never reads them)."""
    return torch.empty(len(lengths) + 1, dtype=torch.int32, device="cuda")


class Calls(TorchDispatchMode):
    """Records every call of torch's two flash ops (op, args, kwargs, results) and runs it."""

    def __init__(self):
        super().__init__()
        self.log = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in (FWD, BWD):
            self.log.append((func, args, kwargs or {}, out))
        return out


class Ctx:
    """What the Functions use of autograd's ctx: autograd itself cannot record fake CUDA tensors on a CPU build,
    so the tests call forward and backward as autograd would."""

    def save_for_backward(self, *tensors):
        self.saved_tensors = tensors


# ---- the call plumbing, fake CUDA tensors ------------------------------------------------------------------

def _check_forward(call, q, k, v, cu_q, cu_k, lq, lk, p, causal):
    func, args, kwargs, out = call
    assert func is FWD
    assert args[:3] == (q, k, v) and args[3] is cu_q and args[4] is cu_k
    assert args[5:] == (max(lq), max(lk), p, causal, False) and kwargs == {"scale": SCALE}
    for t in (q, k, v):
        assert t.device.type == "cuda" and t.is_contiguous()
    assert cu_q.dtype == cu_k.dtype == torch.int32 and cu_q.device.type == "cuda"
    return out


def _check_backward(call, dout, q, k, v, cu_q, cu_k, lq, lk, p, causal, fwd_out):
    func, args, kwargs, grads = call
    assert func is BWD
    assert args[0].shape == dout.shape and args[0].dtype == dout.dtype
    assert args[1:4] == (q, k, v)
    out, lse, rng_state, unused = fwd_out[:4]
    # the forward's saved state itself: its output, log-sum-exp and the rng state of its dropout mask
    assert args[4] is out and args[5] is lse and args[12] is rng_state and args[13] is unused
    assert lse.shape == (q.shape[1], q.shape[0]) and lse.dtype == torch.float32
    assert args[6] is cu_q and args[7] is cu_k and args[8:12] == (max(lq), max(lk), p, causal)
    assert kwargs == {"scale": SCALE}
    return grads


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", HALF, ids=["fp16", "bf16"])
@pytest.mark.parametrize("p", [0.0, 0.1])
@pytest.mark.parametrize("recompute", [False, True], ids=["keep", "recompute"])
def test_attention_reaches_torchs_op_and_backward_gets_its_state(shape, dtype, p, recompute):
    lq, lk, causal = SHAPES[shape]
    H, D = 2, 64
    calls = Calls()
    with FakeTensorMode(allow_non_fake_inputs=False), calls:
        q = torch.empty(sum(lq), H, D, dtype=dtype, device="cuda")
        k, v = (torch.empty(sum(lk), H, D, dtype=dtype, device="cuda") for _ in range(2))
        cu_q, cu_k = _offsets(lq), _offsets(lk)
        ctx = Ctx()
        out = FlashVarlenAttentionFunction.forward(ctx, q, k, v, cu_q, cu_k, max(lq), max(lk), causal, SCALE, p,
                                                   recompute)
        dout = torch.empty_like(out)
        dq, dk, dv = FlashVarlenAttentionFunction.backward(ctx, dout)[:3]
    fwd = _check_forward(calls.log[0], q, k, v, cu_q, cu_k, lq, lk, p, causal)
    assert out is fwd[0] and out.shape == q.shape and out.dtype == dtype
    if recompute:  # backward ran the forward again, same arguments, and took that forward's state
        assert len(ctx.saved_tensors) == 5
        fwd = _check_forward(calls.log[1], q, k, v, cu_q, cu_k, lq, lk, p, causal)
    grads = _check_backward(calls.log[-1], dout, q, k, v, cu_q, cu_k, lq, lk, p, causal, fwd)
    assert [c[0] for c in calls.log] == ([FWD, FWD, BWD] if recompute else [FWD, BWD])
    assert (dq, dk, dv) == tuple(grads)


def _block_weights(E, Ek, dtype, device):
    def t(*shape):
        return torch.empty(*shape, dtype=dtype, device=device)
    return (t(E), t(E), t(E, E), t(E), t(E, Ek), t(E), t(E, Ek), t(E), t(E, E), t(E))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", HALF, ids=["fp16", "bf16"])
@pytest.mark.parametrize("normalize_before", [False, True], ids=["post-ln", "pre-ln"])
@pytest.mark.parametrize("recompute", [False, True], ids=["keep", "recompute"])
def test_the_block_calls_torchs_op_once_each_way(shape, dtype, normalize_before, recompute):
    """The one-node sublayer: q, k, v projected as [N, H, D] from the (normalised) rows or the memory, one flash
    forward, one flash backward with its state; gradients for every parameter and the memory, shaped as them."""
    lq, lk, causal = SHAPES[shape]
    E, H = 128, 2
    calls = Calls()
    with FakeTensorMode(allow_non_fake_inputs=False), calls:
        x = torch.empty(sum(lq), E, dtype=dtype, device="cuda")
        memory = None if shape != "cross" else torch.empty(sum(lk), 96, dtype=dtype, device="cuda")
        weights = _block_weights(E, 96 if memory is not None else E, dtype, "cuda")
        cu_q, cu_k = _offsets(lq), _offsets(lk)
        rows = torch.empty(sum(lq), dtype=torch.int64, device="cuda")
        cfg = AttentionBlockConfig(H, SCALE, causal, normalize_before, 1e-5, ops.Dropout(0.1, 3, 5),
                                   ops.Dropout(0.2, 3, 7, rows), recompute=recompute)
        ctx = Ctx()
        y = FlashPackedAttentionBlockFunction.forward(ctx, x, memory, cu_q, cu_k, rows, *weights, max(lq), max(lk),
                                                      cfg)
        grads = FlashPackedAttentionBlockFunction.backward(ctx, torch.empty_like(y))
    assert y.shape == x.shape and y.dtype == dtype
    q, k, v = calls.log[0][1][:3]
    assert q.shape == (sum(lq), H, E // H) and k.shape == v.shape == (sum(lk), H, E // H)
    fwd = _check_forward(calls.log[0], q, k, v, cu_q, cu_k, lq, lk, 0.1, causal)
    if recompute:
        q, k, v = calls.log[1][1][:3]
        fwd = _check_forward(calls.log[1], q, k, v, cu_q, cu_k, lq, lk, 0.1, causal)
    _check_backward(calls.log[-1], calls.log[-1][1][0], q, k, v, cu_q, cu_k, lq, lk, 0.1, causal, fwd)
    assert len(calls.log) == (3 if recompute else 2)
    inputs = (x, memory, cu_q, cu_k, rows, *weights)
    for g, t in zip(grads, inputs):
        if t is None or t.dtype in (torch.int32, torch.int64):
            assert g is None
        else:
            assert g.shape == t.shape and g.dtype == t.dtype


def _our_forward(q, k, v, cu_q, cu_k, max_q, max_k, p, causal, scale):
    out, lse = torch.ops.fairseq_lightseq.varlen_attention_fwd(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, 0.0,
                                                               0, 0, None, 0, 0)
    return flash_attention.FlashResult(out, lse, lse.new_empty(0), lse.new_empty(0))


def _our_backward(dout, q, k, v, cu_q, cu_k, max_q, max_k, p, causal, scale, saved):
    return torch.ops.fairseq_lightseq.varlen_attention_bwd(dout.contiguous(), q, k, v, saved.out, saved.lse, cu_q,
                                                           cu_k, max_q, max_k, causal, scale, 0.0, 0, 0, None, 0, 0)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("normalize_before", [False, True], ids=["post-ln", "pre-ln"])
@pytest.mark.parametrize("recompute", [False, True], ids=["keep", "recompute"])
def test_the_blocks_arithmetic_around_the_attention_is_the_compiled_blocks(shape, normalize_before, recompute,
                                                                          monkeypatch):
    """The Python node's norms, projections, residual dropout (row map) and their backward, float64 on the CPU,
    with our varlen kernel standing in for torch's flash pair: output and every gradient equal the compiled packed
    block's (attention dropout 0: the one thing the two blocks draw differently)."""
    from fairseq_lightseq.ops.blocks import flash_packed_attention
    monkeypatch.setattr(flash_packed_attention, "flash_forward", _our_forward)
    monkeypatch.setattr(flash_packed_attention, "flash_backward", _our_backward)
    lq, lk, causal = SHAPES[shape]
    E, Ek, H = 16, 12 if shape == "cross" else 16, 2
    dt = torch.float64
    x = randn(sum(lq), E, dtype=dt, seed=1)
    memory = randn(sum(lk), Ek, dtype=dt, seed=2) if shape == "cross" else None
    weights = [randn(*w.shape, dtype=dt, seed=10 + i) * 0.3 for i, w in enumerate(_block_weights(E, Ek, dt, "cpu"))]
    cu_q, cu_k = _cu(lq, "cpu"), _cu(lk, "cpu")
    rows = torch.randperm(3 * sum(lq), generator=torch.Generator().manual_seed(0))[:sum(lq)]
    cfg = AttentionBlockConfig(H, SCALE, causal, normalize_before, 1e-5, ops.Dropout(),
                               ops.Dropout(0.2, 3, 7, rows), recompute=recompute)
    grad = randn(sum(lq), E, dtype=dt, seed=3)
    results = []
    for block in (flash_packed_attention_block, packed_attention_block):
        leaves = [t.detach().requires_grad_() for t in (x, *weights) + ((memory,) if memory is not None else ())]
        mem = leaves[-1] if memory is not None else None
        extra = () if block is flash_packed_attention_block else (None,)
        y = block(leaves[0], mem, cu_q, cu_k, max(lq), max(lk), *extra, *leaves[1:11], cfg)
        y.backward(grad)
        results.append((y.detach(), [t.grad for t in leaves]))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-12, atol=1e-12)
    for a, b in zip(results[0][1], results[1][1]):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


# ---- where flash runs: the schema check and the fallback ------------------------------------------------------

def test_the_schema_check_accepts_this_torch():
    assert flash_attention.SCHEMA_PROBLEM is None


# stand-ins for a torch whose ops changed: an argument inserted or added without a default, the returned tuple,
# a type, the scale keyword
CHANGED = {
    "inserted argument": (flash_attention.EXPECTED_FORWARD.replace("bool is_causal,", "bool is_causal, int window,"),
                          None, "argument 9 (window) is int"),
    "added argument": (None, flash_attention.EXPECTED_BACKWARD.replace("Tensor unused, *", "Tensor unused, int w, *"),
                       "needs argument w"),
    "returns": (None, flash_attention.EXPECTED_BACKWARD.replace("-> (Tensor, Tensor, Tensor)", "-> (Tensor, Tensor)"),
                "returns 2 tensors"),
    "type": (flash_attention.EXPECTED_FORWARD.replace("float dropout_p", "Tensor dropout_p"), None, "argument 7"),
    "no scale": (flash_attention.EXPECTED_FORWARD.replace(", *, float? scale=None", ""), None, "keyword argument"),
}


@pytest.mark.parametrize("change", CHANGED)
def test_a_changed_schema_is_refused_and_flash_falls_back_with_one_warning(change, monkeypatch):
    fwd, bwd, message = CHANGED[change]
    fwd = torch._C.parse_schema(fwd) if fwd else FWD._schema
    bwd = torch._C.parse_schema(bwd) if bwd else BWD._schema
    problem = flash_attention.schema_problem(fwd, bwd)
    assert problem is not None and message in problem
    monkeypatch.setattr(flash_attention, "SCHEMA_PROBLEM", problem)
    monkeypatch.setattr(_backend, "_warned", set())
    multihead_attention._flash_choice.cache_clear()
    with FakeTensorMode():
        q = torch.empty(4, 2, 64, dtype=torch.float16, device="cuda")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert not multihead_attention.use_flash(q, 64, "auto")
            assert not multihead_attention.use_flash(q, 64, "auto")
    finally:
        multihead_attention._flash_choice.cache_clear()
    assert len(caught) == 1
    text = str(caught[0].message)
    assert torch.__version__ in text and problem in text and "our varlen kernel" in text


@pytest.mark.parametrize("device,dtype,head_dim,capability,reason", [
    ("cpu", torch.float16, 64, None, "CUDA only"),
    ("cuda", torch.float32, 64, (9, 0), "fp16/bf16"),
    ("cuda", torch.bfloat16, 320, (9, 0), "head dim 320"),
    ("cuda", torch.float16, 60, (8, 0), "head dim 60"),
    ("cuda", torch.float16, 64, (7, 5), "7.5"),
    ("cuda", torch.bfloat16, 256, (8, 0), None),
    ("cuda", torch.float16, 64, (9, 0), None),
])
def test_where_flash_applies(device, dtype, head_dim, capability, reason):
    problem = flash_attention.flash_problem(torch.device(device), dtype, head_dim, capability)
    assert problem is None if reason is None else reason in problem


@pytest.mark.parametrize("mode,warns", [("flash", True), ("sdpa", True), ("auto", False), ("explicit", False)])
def test_on_the_cpu_packed_rows_run_our_kernel(mode, warns, monkeypatch):
    """The modes that ask for torch's kernel say once that the CPU has none; auto and explicit run ours quietly."""
    monkeypatch.setattr(_backend, "_warned", set())
    multihead_attention._flash_choice.cache_clear()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert not multihead_attention.use_flash(torch.empty(3, 2, 8), 8, mode)
    finally:
        multihead_attention._flash_choice.cache_clear()
    assert [str(w.message) for w in caught if "flash" in str(w.message)] == (
        [f"fairseq_lightseq: packed attention runs our varlen kernel, not torch {torch.__version__}'s flash varlen "
         "attention: it runs on CUDA only, not on cpu"] if warns else [])


# ---- CUDA: flash against our kernel and the float64 reference ---------------------------------------------------

CUDA_CASES = [*SHAPES.values(), ([1, 1, 1], [1, 4, 1], False), ([2, 137, 1, 3], [2, 137, 1, 3], True),
              ([2, 137, 1, 3], [2, 137, 1, 3], False)]


def _problem(lq, lk, dtype, H=2, D=64, seed=0):
    q = randn(sum(lq), H, D, dtype=dtype, device="cuda", seed=seed) * 2
    k = randn(sum(lk), H, D, dtype=dtype, device="cuda", seed=seed + 1) * 2
    v = randn(sum(lk), H, D, dtype=dtype, device="cuda", seed=seed + 2)
    return q, k, v, _cu(lq, "cuda"), _cu(lk, "cuda")


def _run(fn, q, k, v, grad, cast=None):
    x = [t.detach().to(cast or t.dtype).requires_grad_() for t in (q, k, v)]
    y = fn(*x)
    y.backward(grad.to(y.dtype))
    return y.detach(), [t.grad for t in x]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", HALF, ids=["fp16", "bf16"])
@pytest.mark.parametrize("lq,lk,causal", CUDA_CASES)
def test_cuda_flash_matches_ours_and_the_float64_reference(dtype, lq, lk, causal):
    q, k, v, cu_q, cu_k = _problem(lq, lk, dtype)
    grad = randn(*q.shape, dtype=dtype, device="cuda", seed=9)
    mq, mk = max(lq), max(lk)
    flash = _run(lambda q, k, v: flash_attention.flash_varlen_attention(q, k, v, cu_q, cu_k, mq, mk, causal, SCALE),
                 q, k, v, grad)
    ours = _run(lambda q, k, v: ops.varlen_attention(q, k, v, cu_q, cu_k, mq, mk, causal, SCALE), q, k, v, grad)
    ref = _run(lambda q, k, v: reference.varlen_attention(q, k, v, cu_q.cpu(), cu_k.cpu(), mq, mk, causal, SCALE,
                                                          0.0, 0, 0, None),
               q.cpu(), k.cpu(), v.cpu(), grad.cpu(), cast=torch.float64)
    for got in (flash, ours):
        assert_close(got[0].cpu(), ref[0], dtype=dtype, scale=2)
        for g, gr in zip(got[1], ref[1]):
            assert_close(g.cpu(), gr, dtype=dtype, scale=8)


def _dropped(lq, lk, causal, p, dtype=torch.float16, recompute=False, seed=0):
    q, k, v, cu_q, cu_k = _problem(lq, lk, dtype)
    torch.cuda.manual_seed(seed)
    return _run(lambda q, k, v: flash_attention.flash_varlen_attention(q, k, v, cu_q, cu_k, max(lq), max(lk), causal,
                                                                       SCALE, p, recompute),
                q, k, v, randn(*q.shape, dtype=dtype, device="cuda", seed=9))


@pytest.mark.cuda
def test_cuda_dropout_keeps_the_expected_fraction():
    """q = k = 0: uniform probabilities, v = 1: each output is (kept keys / Lk) / (1 - p), so the mean output
    times (1 - p) is the kept fraction."""
    p, L = 0.3, [256] * 8
    cu = _cu(L, "cuda")
    q = torch.zeros(sum(L), 4, 64, dtype=torch.float16, device="cuda")
    v = torch.ones_like(q)
    out = flash_attention.flash_varlen_attention(q, q, v, cu, cu, 256, 256, False, SCALE, p)
    kept = out.float().mean().item() * (1 - p)
    assert abs(kept - (1 - p)) < 0.01


@pytest.mark.cuda
@pytest.mark.parametrize("lq,lk,causal", list(SHAPES.values()))
def test_cuda_backward_uses_the_forwards_mask(lq, lk, causal):
    """Finite gradients; the same CUDA seed gives the same output and gradients (backward regenerates the mask
    from the saved rng state), with and without recompute (which reruns the forward at the saved generator
    state), and another seed another output."""
    y, grads = _dropped(lq, lk, causal, 0.3)
    assert all(torch.isfinite(g).all() for g in grads)
    for recompute in (False, True):
        y2, grads2 = _dropped(lq, lk, causal, 0.3, recompute=recompute)
        assert torch.equal(y, y2)
        for a, b in zip(grads, grads2):  # (dq may sum in another order: FlashAttention-2's atomic adds)
            assert_close(a, b, scale=0.5)
    assert not torch.equal(y, _dropped(lq, lk, causal, 0.3, seed=1)[0])


@pytest.mark.cuda
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", HALF, ids=["fp16", "bf16"])
@pytest.mark.parametrize("recompute", [False, True], ids=["keep", "recompute"])
def test_cuda_block_matches_our_packed_block(shape, dtype, recompute):
    """The flash sublayer against ours at p = 0 (residual dropout on: the same Philox row mask in both)."""
    lq, lk, causal = SHAPES[shape]
    E, H = 128, 2
    x = randn(sum(lq), E, dtype=dtype, device="cuda", seed=1)
    memory = None if shape != "cross" else randn(sum(lk), E, dtype=dtype, device="cuda", seed=2)
    weights = [randn(*w.shape, dtype=dtype, device="cuda", seed=10 + i) * 0.1
               for i, w in enumerate(_block_weights(E, E, dtype, "cpu"))]
    cu_q, cu_k = _cu(lq, "cuda"), _cu(lk, "cuda")
    rows = torch.arange(sum(lq), device="cuda")
    cfg = AttentionBlockConfig(H, SCALE, causal, False, 1e-5, ops.Dropout(), ops.Dropout(0.2, 3, 7, rows),
                               recompute=recompute)
    results = []
    for block in (flash_packed_attention_block, packed_attention_block):
        leaves = [t.detach().requires_grad_() for t in (x, *weights)]
        extra = () if block is flash_packed_attention_block else (None,)
        y = block(leaves[0], memory, cu_q, cu_k, max(lq), max(lk), *extra, *leaves[1:], cfg)
        y.float().square().sum().backward()
        results.append((y.detach(), [t.grad for t in leaves]))
    assert_close(results[0][0], results[1][0], dtype=dtype, scale=2)
    for a, b in zip(results[0][1], results[1][1]):
        assert_close(a, b, dtype=dtype, scale=16)
