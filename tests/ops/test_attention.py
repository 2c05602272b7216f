"""Attention family: scale + masks + softmax + dropout, qkv bias + head split, head merge; the fused
kernels against the reference (fairseq_lightseq/ops/reference/attention.py), forward and backward."""
import pytest
import torch

from support.tensors import CUDA_DEVICES, DEVICE_DTYPES, DEVICES, assert_close, cpu_kernels, randn
from fairseq_lightseq import ops
from fairseq_lightseq.ops import reference
from fairseq_lightseq.ops.attention import (AttentionSoftmaxDropoutFunction, MergeHeadsFunction,
                                            QkvBiasSplitFunction)
from fairseq_lightseq.ops.reference.philox import keep_mask

SM = AttentionSoftmaxDropoutFunction.apply


def _pad_mask(kind, B, Tk, device):
    """None, right padding (fairseq's source side), left padding (left_pad_source), or a batch whose
    first sentence is all padding."""
    if kind == "none":
        return None
    m = torch.zeros(B, Tk, dtype=torch.bool)
    lengths = [max(1, Tk - 1 - 3 * b) for b in range(B)]
    for b, n in enumerate(lengths):
        if kind == "right":
            m[b, n:] = True
        elif kind == "left":
            m[b, : Tk - n] = True
        elif kind == "allpad":
            m[b, n:] = True
    if kind == "allpad":
        m[0, :] = True
    return m.to(device)


# (B, H, Tq, Tk, padding, causal)
SOFTMAX_CASES = [
    (1, 1, 1, 1, "none", False),
    (2, 3, 5, 37, "right", False),
    (3, 2, 4, 129, "left", False),
    (1, 2, 3, 2048, "right", False),  # a 2048-key row
    (2, 2, 6, 6, "none", True),
    (2, 2, 7, 12, "right", True),  # causal with Tq < Tk (incremental decoding)
    (2, 1, 5, 3, "none", True),  # Tq > Tk: the first rows see no key -> zeros
    (3, 2, 4, 33, "allpad", False),
    # key lengths that take the CUDA register-row path (Tk <= 1024, a multiple of 8)
    (2, 2, 3, 64, "right", True),
    (2, 4, 5, 128, "left", False),
    (1, 2, 3, 1024, "allpad", False),
    (2, 2, 3, 200, "right", False),  # 2 vectors a lane (fp32), 1 (2-byte types)
    (1, 2, 3, 1000, "left", True),  # 8 vectors a lane (fp32), 4 (2-byte types)
]


def _softmax_pair(case, device, dtype, p, seed=11, offset=0, scale=0.37):
    B, H, Tq, Tk, kind, causal = case
    s = randn(B, H, Tq, Tk, dtype=dtype, device=device, seed=seed) * 4
    m = _pad_mask(kind, B, Tk, device)
    x, xr = s.clone().requires_grad_(), s.clone().requires_grad_()
    y = SM(x, m, causal, scale, p, 1234, offset)
    yr = reference.attention_softmax_dropout(xr, m, causal, scale, p, 1234, offset)
    return x, xr, y, yr


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("case", SOFTMAX_CASES,
                         ids=lambda c: "x".join(map(str, c[:4])) + f"-{c[4]}-{'causal' if c[5] else 'full'}")
@pytest.mark.parametrize("p", [0.0, 0.25])
def test_softmax_dropout_matches_reference(device, dtype, case, p):
    x, xr, y, yr = _softmax_pair(case, device, dtype, p)
    assert y.dtype == dtype and y.shape == x.shape
    assert not torch.isnan(y).any()
    assert_close(y, yr, scale=2)
    dy = randn(*x.shape, dtype=dtype, device=device, seed=5)
    y.backward(dy)
    yr.backward(dy)
    assert not torch.isnan(x.grad).any()
    assert_close(x.grad, xr.grad, scale=4)


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_all_padding_row_gives_zeros_and_zero_grad(device, dtype):
    B, H, Tq, Tk = 2, 2, 3, 9
    m = torch.zeros(B, Tk, dtype=torch.bool, device=device)
    m[1] = True
    x = randn(B, H, Tq, Tk, dtype=dtype, device=device, seed=1).requires_grad_()
    for p in (0.0, 0.3):
        y = SM(x, m, False, 1.0, p, 7, 0)
        assert torch.equal(y[1], torch.zeros_like(y[1])) and not torch.isnan(y).any()
        x.grad = None
        y.backward(randn(*y.shape, dtype=dtype, device=device, seed=2))
        assert torch.equal(x.grad[1], torch.zeros_like(x.grad[1]))
        # Padded keys of other rows get zero probability and zero gradient too.
        assert torch.isfinite(x.grad).all()


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_padded_and_future_keys_are_exactly_zero(device, dtype):
    B, H, Tq, Tk = 2, 2, 5, 8
    m = _pad_mask("right", B, Tk, device)
    x = randn(B, H, Tq, Tk, dtype=dtype, device=device, seed=3) * 10
    y = SM(x, m, True, 1.0, 0.0, 0, 0)
    j = torch.arange(Tk, device=device).view(1, Tk)
    i = torch.arange(Tq, device=device).view(Tq, 1)
    masked = m.view(B, 1, 1, Tk) | (j > i + Tk - Tq).view(1, 1, Tq, Tk)
    assert torch.equal(y.masked_select(masked), torch.zeros_like(y.masked_select(masked)))
    # Rows with a visible key sum to 1.
    assert_close(y.double().sum(-1), torch.ones(B, H, Tq, device=device, dtype=torch.float64), dtype=dtype, scale=2)


@pytest.mark.parametrize("device", DEVICES)
def test_long_row_64k_keys(device):
    Tk = 65536
    s = randn(1, 1, 2, Tk, device=device, seed=4) * 3
    m = torch.zeros(1, Tk, dtype=torch.bool, device=device)
    m[0, -1000:] = True
    y = SM(s, m, False, 0.5, 0.1, 9, 0)
    yr = reference.attention_softmax_dropout(s, m, False, 0.5, 0.1, 9, 0)
    assert_close(y, yr, scale=2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("offset", [0, 3, 4 * 2**20 + 1])
@pytest.mark.parametrize("Tk", [37, 64])
def test_dropout_mask_equals_reference_bit_for_bit(device, offset, Tk):
    # 37: rows start at every lane of a Philox group; 64 (CUDA vector path): every row starts at the
    # same lane, a group boundary or not depending on the offset
    B, H, Tq, p = 2, 3, 4, 0.3
    s = randn(B, H, Tq, Tk, device=device, seed=8)
    out = SM(s, None, False, 1.0, p, 987654321, offset)
    keep = keep_mask(out.numel(), p, 987654321, offset, device=device).view(out.shape)
    assert torch.equal(out != 0, keep)
    ref = reference.attention_softmax_dropout(s, None, False, 1.0, p, 987654321, offset)
    assert torch.equal(ref != 0, keep)
    assert_close(out, ref)  # values: the kernel's exp may differ from torch's in the last bit


def test_dropout_kept_fraction_and_reproducibility():
    p, n = 0.1, 8 * 8 * 64 * 64
    s = randn(8, 8, 64, 64, seed=0)
    out = SM(s, None, False, 1.0, p, 42, 0)
    kept = (out != 0).double().mean().item()
    sd = (p * (1 - p) / n) ** 0.5
    assert abs(kept - (1 - p)) < 5 * sd
    assert torch.equal(out, SM(s, None, False, 1.0, p, 42, 0))
    assert not torch.equal(out, SM(s, None, False, 1.0, p, 43, 0))


def test_public_api_seeds_from_torch_generator_and_eval_skips_rng():
    s = randn(2, 2, 3, 17, seed=1)
    torch.manual_seed(5)
    a = ops.attention_softmax_dropout(s, None, False, 1.0, 0.2, training=True)
    torch.manual_seed(5)
    seed = ops.next_seed()
    r = reference.attention_softmax_dropout(s, None, False, 1.0, 0.2, seed)
    assert torch.equal(a != 0, r != 0)
    assert_close(a, r)
    state = torch.get_rng_state()
    e = ops.attention_softmax_dropout(s, None, False, 1.0, 0.2, training=False)
    z = ops.attention_softmax_dropout(s, None, False, 1.0, 0.0, training=True)
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(e, z)
    assert_close(e, reference.attention_softmax_dropout(s, None, False, 1.0, 0.0))


def test_op_outputs_without_dropout():
    y, out = torch.ops.fairseq_lightseq.attention_softmax_fwd(randn(1, 2, 3, 5), None, False, 1.0, 0.0, 0, 0)
    assert y.shape == (1, 2, 3, 5) and out.numel() == 0


@pytest.mark.parametrize("p", [0.0, 0.3])
@pytest.mark.parametrize("causal,kind,shape", [(False, "right", (2, 2, 3, 7)), (True, "left", (2, 1, 4, 6)),
                                               (True, "none", (1, 2, 5, 3)), (False, "allpad", (2, 1, 2, 5))])
def test_gradcheck_float64(p, causal, kind, shape):
    B, H, Tq, Tk = shape
    x = randn(*shape, dtype=torch.float64, seed=3).requires_grad_()
    m = _pad_mask(kind, B, Tk, "cpu")
    assert torch.autograd.gradcheck(lambda x: SM(x, m, causal, 0.7, p, 77, 5), (x,))


# ---- qkv bias + split, merge ----

# (T, B, heads, head_dim)
SPLIT_SHAPES = [(1, 1, 1, 8), (5, 3, 4, 7), (7, 2, 8, 64), (3, 2, 2, 200), (1, 4, 3, 5),
                (64, 9, 4, 16)]  # 576 rows: several chunks in the CUDA column sums


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("shape", SPLIT_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_qkv_bias_split_matches_reference(device, dtype, shape):
    T, B, nh, hd = shape
    E = nh * hd
    qkv = randn(T, B, 3 * E, dtype=dtype, device=device, seed=1).requires_grad_()
    bias = randn(3 * E, dtype=dtype, device=device, seed=2).requires_grad_()
    qkv_r, bias_r = qkv.detach().clone().requires_grad_(), bias.detach().clone().requires_grad_()
    outs = ops.qkv_bias_split(qkv, bias, nh)
    refs = reference.qkv_bias_split(qkv_r, bias_r, nh)
    for o, r in zip(outs, refs):
        assert o.shape == (B * nh, T, hd) and o.is_contiguous() and o.dtype == dtype
        assert torch.equal(o, r)  # one rounding of the same fp32 sum
    grads = [randn(B * nh, T, hd, dtype=dtype, device=device, seed=10 + i) for i in range(3)]
    torch.autograd.backward(outs, grads)
    torch.autograd.backward(refs, grads)
    assert torch.equal(qkv.grad, qkv_r.grad)
    assert_close(bias.grad, bias_r.grad, scale=4 * (T * B) ** 0.5)


def test_qkv_split_backward_with_unused_outputs():
    qkv = randn(4, 2, 3 * 12, seed=1).requires_grad_()
    bias = randn(3 * 12, seed=2).requires_grad_()
    q, k, v = ops.qkv_bias_split(qkv, bias, 3)
    q.sum().backward()
    assert torch.equal(qkv.grad[..., :12], torch.ones(4, 2, 12))
    assert torch.equal(qkv.grad[..., 12:], torch.zeros(4, 2, 24))
    assert torch.equal(bias.grad, torch.cat([torch.full((12,), 8.0), torch.zeros(24)]))


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("shape", SPLIT_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_merge_heads_matches_reference(device, dtype, shape):
    T, B, nh, hd = shape
    x = randn(B * nh, T, hd, dtype=dtype, device=device, seed=3).requires_grad_()
    xr = x.detach().clone().requires_grad_()
    y = ops.merge_heads(x, nh)
    yr = reference.merge_heads(xr, nh)
    assert y.shape == (T, B, nh * hd) and torch.equal(y, yr)
    dy = randn(T, B, nh * hd, dtype=dtype, device=device, seed=4)
    y.backward(dy)
    yr.backward(dy)
    assert torch.equal(x.grad, xr.grad)


def test_merge_inverts_split():
    T, B, nh, hd = 6, 3, 4, 7
    qkv = randn(T, B, 3 * nh * hd, seed=1)
    q, k, v = ops.qkv_bias_split(qkv, torch.zeros(3 * nh * hd), nh)
    assert torch.equal(torch.cat([ops.merge_heads(t, nh) for t in (q, k, v)], -1), qkv)


def test_gradcheck_split_merge_float64():
    qkv = randn(3, 2, 3 * 10, dtype=torch.float64, seed=1).requires_grad_()
    bias = randn(30, dtype=torch.float64, seed=2).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: QkvBiasSplitFunction.apply(a, b, 5), (qkv, bias))
    x = randn(2 * 5, 3, 2, dtype=torch.float64, seed=3).requires_grad_()
    assert torch.autograd.gradcheck(lambda a: MergeHeadsFunction.apply(a, 5), (x,))


def test_dbias_is_deterministic_across_thread_counts():
    dq, dk, dv = [randn(8 * 4, 300, 16, seed=i) for i in range(3)]
    n = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        a = torch.ops.fairseq_lightseq.qkv_bias_split_bwd(dq, dk, dv, 4)
        torch.set_num_threads(max(2, n))
        b = torch.ops.fairseq_lightseq.qkv_bias_split_bwd(dq, dk, dv, 4)
    finally:
        torch.set_num_threads(n)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


# ---- kernels on CUDA agree with the CPU kernels (same Philox stream) ----

@pytest.mark.parametrize("device", CUDA_DEVICES)
@pytest.mark.parametrize("Tk", [129, 64])
def test_cuda_dropout_mask_equals_cpu(device, Tk):
    s = randn(2, 3, 5, Tk, seed=1)
    m = _pad_mask("left", 2, Tk, "cpu")
    with cpu_kernels():
        a = SM(s, m, True, 0.5, 0.2, 31337, 7)
    b = SM(s.to(device), m.to(device), True, 0.5, 0.2, 31337, 7).cpu()
    assert torch.equal(a != 0, b != 0)
    assert_close(b, a, scale=2)


# ---- bad input ----

@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: SM(randn(2, 1, 3, 5), torch.zeros(2, 4, dtype=torch.bool), False, 1.0, 0.0, 0, 0),
         "key_padding_mask must have shape"),
        (lambda: SM(randn(2, 1, 3, 5), torch.zeros(2, 5), False, 1.0, 0.0, 0, 0), "key_padding_mask must be bool"),
        (lambda: SM(randn(2, 3, 5), None, False, 1.0, 0.0, 0, 0), "scores must be 4-D"),
        (lambda: SM(randn(2, 1, 3, 5).half(), None, False, 1.0, 0.0, 0, 0),
         "scores must be float32, float64 or bfloat16"),
        (lambda: SM(randn(2, 1, 3, 5), None, False, 1.0, 1.5, 0, 0), "dropout p must be in"),
        (lambda: SM(randn(2, 1, 3, 5), None, False, float("nan"), 0.0, 0, 0), "scale must be finite"),
        (lambda: ops.qkv_bias_split(randn(2, 3, 30), randn(30), 4), "num_heads 4 must divide"),
        (lambda: ops.qkv_bias_split(randn(2, 3, 31), randn(31), 1), "multiple of 3"),
        (lambda: ops.qkv_bias_split(randn(2, 3, 30), randn(29), 5), "bias must have shape"),
        (lambda: ops.qkv_bias_split(randn(2, 3, 30), randn(30), 0), "num_heads must be > 0"),
        (lambda: ops.qkv_bias_split(randn(2, 3, 30), randn(30, dtype=torch.float64), 5), "bias has dtype"),
        (lambda: ops.merge_heads(randn(6, 3, 4), 4), "num_heads 4 must divide"),
        (lambda: ops.merge_heads(randn(6, 4), 2), "x must be 3-D"),
    ],
)
def test_bad_input_names_the_argument(call, match):
    with pytest.raises(RuntimeError, match=match):
        call()


def test_uses_the_compiled_kernels_on_cpu():
    for op in ("attention_softmax_fwd", "attention_softmax_bwd", "qkv_bias_split", "qkv_bias_split_bwd",
               "merge_heads"):
        assert ops.has_kernel(op, "cpu")


def test_traces_under_torch_compile_fake_tensors():
    from torch._subclasses.fake_tensor import FakeTensorMode

    O = torch.ops.fairseq_lightseq
    with FakeTensorMode():
        y, out = O.attention_softmax_fwd(torch.empty(2, 4, 3, 5), None, True, 0.5, 0.1, 1, 0)
        q, k, v = O.qkv_bias_split(torch.empty(3, 2, 48), torch.empty(48), 4)
        dqkv, db = O.qkv_bias_split_bwd(q, k, v, 4)
        mh = O.merge_heads(q, 4)
    assert y.shape == out.shape == (2, 4, 3, 5)
    assert q.shape == (8, 3, 4) and dqkv.shape == (3, 2, 48) and db.shape == (48,) and mh.shape == (3, 2, 16)


@pytest.mark.parametrize("p", [0.0, 0.3])
def test_bfloat16_equals_float32_kernel_rounded_once(p):
    """The CPU bf16 path converts rows with its own vectorised bf16<->fp32 code: it must round as c10."""
    O = torch.ops.fairseq_lightseq
    s = (randn(3, 2, 7, 301, seed=1) * 5).bfloat16()
    g = randn(3, 2, 7, 301, seed=2).bfloat16()
    y, out = O.attention_softmax_fwd(s, None, True, 0.8, p, 5, 3)
    y32, out32 = O.attention_softmax_fwd(s.float(), None, True, 0.8, p, 5, 3)
    assert torch.equal(y, y32.bfloat16()) and torch.equal(out, out32.bfloat16())
    ds = O.attention_softmax_bwd(g, y, 0.8, p, 5, 3)
    assert torch.equal(ds, O.attention_softmax_bwd(g.float(), y.float(), 0.8, p, 5, 3).bfloat16())


def test_merge_heads_backward_is_a_view_of_the_gradient():
    x = randn(2 * 4, 5, 6, seed=1).requires_grad_()
    y = ops.merge_heads(x, 4)
    dy = randn(5, 2, 24, seed=2)
    (dx,) = torch.autograd.grad(y, x, dy)
    assert dx.data_ptr() == dy.data_ptr() and dx.stride() == (6, 2 * 24, 1)  # no copy
    xr = x.detach().clone().requires_grad_()
    reference.merge_heads(xr, 4).backward(dy)
    assert torch.equal(dx, xr.grad)
