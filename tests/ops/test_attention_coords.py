"""Attention dropout coordinates (ops.AttentionCoords): a call on a slice of heads, queries or keys of a
larger problem, given its place in it, draws the dropout mask of the full call. Checked against the full
call itself (bitwise on the CPU, where rows are computed independently), the reference, and CUDA against
the CPU kernel. The default coordinates are today's call, bit for bit."""
import pytest
import torch

from support.tensors import CUDA_DEVICES, DEVICE_DTYPES, assert_close, assert_same_or_close, cpu_kernels, randn
from fairseq_lightseq import ops
from fairseq_lightseq.ops import reference
from fairseq_lightseq.ops.attention import AttentionSoftmaxDropoutFunction
from fairseq_lightseq.ops.reference.attention import stream_index
from fairseq_lightseq.ops.reference.philox import keep_bits

SM = AttentionSoftmaxDropoutFunction.apply
SEED = -4044249281812771813
SCALE = 0.41


def _scores(B, H, Tq, Tk, device, dtype, seed=3):
    return randn(B, H, Tq, Tk, dtype=dtype, device=device, seed=seed) * 4


def _pad(B, Tk, device, left=False):
    """Ragged key padding: sentence b has max(1, Tk - 2b) keys (at the right end when `left`)."""
    m = torch.zeros(B, Tk, dtype=torch.bool)
    for b in range(B):
        n = max(1, Tk - 2 * b)
        if left:
            m[b, : Tk - n] = True
        else:
            m[b, n:] = True
    return m.to(device)


def _run(scores, mask, causal, draw, coords=None, grad=None, public=True):
    """(probs, dscores) of one call; dscores for the upstream gradient `grad` (random if None)."""
    x = scores.detach().clone().requires_grad_()
    if public:
        y = ops.attention_softmax_dropout(x, mask, causal, SCALE, draw, coords=coords)
    else:
        y = SM(x, mask, causal, SCALE, *draw[:3], *(() if coords is None else (list(coords),)))
    g = randn(*y.shape, dtype=y.dtype, device=y.device, seed=9) if grad is None else grad
    y.backward(g)
    return y.detach(), x.grad


def _same_zeros(a, b, probs):
    """a and b drop the same entries: equal zero patterns where the undropped probability `probs` is not tiny
    (fp16 flushes tiny ones to zero, so those may differ across paths)."""
    sel = probs.float().abs().cpu() > 1e-3
    assert torch.equal((a.cpu() == 0)[sel], (b.cpu() == 0)[sel])


# ---- the default coordinates are today's call ----

@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("B,H,Tq,Tk,causal", [(2, 3, 5, 37, False), (2, 2, 7, 64, True), (1, 1, 1, 1, False)])
@pytest.mark.parametrize("p", [0.0, 0.1, 0.5])
def test_default_coords_are_bit_identical_to_the_call_without(device, dtype, B, H, Tq, Tk, causal, p):
    s, m = _scores(B, H, Tq, Tk, device, dtype), _pad(B, Tk, device)
    draw = ops.Dropout(p, SEED, 13)
    y0, g0 = _run(s, m, causal, draw, public=False)  # the op without the coords argument
    for coords in (None, (), (H, 0, Tq, 0, Tk, 0), ops.AttentionCoords(H, 0, Tq, 0, Tk, 0)):
        for public in (True, False):
            y, g = _run(s, m, causal, draw, coords, public=public)
            assert torch.equal(y, y0) and torch.equal(g, g0), (coords, public)


# ---- slices with coordinates equal the slice of the full call ----

# (B, H, Tq, Tk, heads [h0, h1), queries [q0, q1), causal, padding rows)
SLICES = [
    (2, 4, 6, 6, (1, 3), (0, 6), False, 0),  # head slice (ulysses without padding)
    (2, 3, 7, 7, (2, 3), (0, 7), True, 1),  # one head, causal, one padding row and key (T = 7 over P = 2)
    (3, 2, 5, 5, (0, 2), (2, 5), False, 0),  # query rows, all keys
    (2, 2, 7, 7, (0, 2), (4, 7), True, 1),  # query rows over the causal key prefix [0, 7), a padding row
    (2, 3, 9, 9, (1, 2), (3, 6), True, 0),  # heads and rows, causal prefix [0, 6)
    (2, 2, 9, 9, (0, 2), (0, 1), True, 0),  # Tq = 1, first row: one key
    (2, 2, 5, 11, (0, 2), (4, 5), True, 2),  # Tq < Tk (lower-right causal), Tq_loc = 1, two padding rows
    (1, 2, 3, 64, (1, 2), (1, 3), False, 0),  # a CUDA register-row key length
]


def _local_problem(case, device, dtype, p, kind):
    """The full call's inputs and outputs, and the local slice's inputs with coordinates, as a sequence-
    parallel rank builds them: heads [h0, h1), queries [q0, q1) and the keys they need (all keys, or the
    causal prefix), then `pad` padding rows and padding keys (masked) at the end."""
    B, H, Tq, Tk, (h0, h1), (q0, q1), causal, pad = case
    s, m = _scores(B, H, Tq, Tk, device, dtype), _pad(B, Tk, device, left=kind == "left")
    draw = ops.Dropout(p, SEED, 1 << 40)
    g = randn(B, H, Tq, Tk, dtype=dtype, device=device, seed=5)
    y, ds = _run(s, m, causal, draw, grad=g)
    k1 = q1 + (Tk - Tq) if causal else Tk  # the last key a local query sees, + 1
    ls = s[:, h0:h1, q0:q1, :k1]
    lm, lg = m[:, :k1], g[:, h0:h1, q0:q1, :k1]
    if pad:  # padding rows and keys: random scores, keys masked
        Hl = h1 - h0
        ls = torch.cat([ls, _scores(B, Hl, q1 - q0, pad, device, dtype, seed=7)], dim=3)
        ls = torch.cat([ls, _scores(B, Hl, pad, k1 + pad, device, dtype, seed=8)], dim=2)
        lm = torch.cat([lm, torch.ones(B, pad, dtype=torch.bool, device=device)], dim=1)
        lg = torch.nn.functional.pad(lg, (0, pad, 0, pad), value=0.5)
    coords = ops.AttentionCoords(H, h0, Tq, q0, Tk, 0)
    return (y, ds, (h0, h1, q0, q1, k1)), (ls, lm, causal, draw, coords, lg)


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("case", SLICES)
@pytest.mark.parametrize("p", [0.1, 0.5])
def test_slice_with_coords_equals_slice_of_full_call(device, dtype, case, p):
    (y, ds, (h0, h1, q0, q1, k1)), (ls, lm, causal, draw, coords, lg) = _local_problem(case, device, dtype, p,
                                                                                       "right")
    yl, dsl = _run(ls, lm, causal, draw, coords, grad=lg)
    n, k = q1 - q0, k1
    assert_same_or_close(yl[:, :, :n, :k], y[:, h0:h1, q0:q1, :k1])
    assert_same_or_close(dsl[:, :, :n, :k], ds[:, h0:h1, q0:q1, :k1])
    # keys past the prefix are causally masked in the full call, and padding keys in the local one
    assert not y[:, h0:h1, q0:q1, k1:].any() and not yl[:, :, :n, k:].any()


@pytest.mark.parametrize("case", SLICES[:4])
def test_slice_with_left_padding_and_the_kernel_function(case):
    (y, ds, (h0, h1, q0, q1, k1)), (ls, lm, causal, draw, coords, lg) = _local_problem(
        case, "cpu", torch.float32, 0.1, "left")
    yl, dsl = _run(ls, lm, causal, draw, coords, grad=lg, public=False)
    n = q1 - q0
    assert torch.equal(yl[:, :, :n, :k1], y[:, h0:h1, q0:q1, :k1])
    assert torch.equal(dsl[:, :, :n, :k1], ds[:, h0:h1, q0:q1, :k1])


# (h0, h1, q0, q1, k0, k1) of a [2, 3, 6, 13] problem: any block, key ranges not starting at 0
BLOCKS = [(0, 3, 0, 6, 5, 13), (1, 2, 2, 5, 3, 10), (2, 3, 5, 6, 12, 13), (0, 1, 1, 4, 1, 9)]


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("block", BLOCKS)
def test_key_slices_draw_the_full_calls_mask(device, dtype, block):
    """A key slice normalises over its own keys, so only the dropout mask is the full call's: the kept
    entries of the slice are those of the full call's mask (reference.keep_mask over the full index)."""
    h0, h1, q0, q1, k0, k1 = block
    B, H, Tq, Tk, p, off = 2, 3, 6, 13, 0.5, 77
    full_keep = reference.keep_mask(B * H * Tq * Tk, p, SEED, off, device).view(B, H, Tq, Tk)
    s = _scores(B, H, Tq, Tk, device, dtype)[:, h0:h1, q0:q1, k0:k1]
    y, _ = _run(s, None, False, ops.Dropout(p, SEED, off), (H, h0, Tq, q0, Tk, k0))
    assert torch.equal(y != 0, full_keep[:, h0:h1, q0:q1, k0:k1])


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("coords,shape", [((5, 2, 9, 4, 17, 3), (2, 2, 3, 7)), ((2, 1, 4, 3, 6, 5), (1, 1, 3, 4)),
                                          ((3, 0, 3, 0, 129, 61), (2, 3, 3, 64))])
@pytest.mark.parametrize("causal", [False, True])
def test_kernel_matches_reference_with_coords(device, dtype, coords, shape, causal):
    """Includes local rows and keys past Tq_tot / Tk_tot (accepted: sequence parallelism's padding)."""
    s, m = _scores(*shape, device, dtype), _pad(shape[0], shape[3], device)
    draw = ops.Dropout(0.3, SEED, 11)
    y, ds = _run(s, m, causal, draw, coords)
    x = s.detach().clone().requires_grad_()
    yr = reference.attention_softmax_dropout(x, m, causal, SCALE, *draw[:3], coords=coords)
    yr.backward(randn(*y.shape, dtype=dtype, device=device, seed=9))
    _same_zeros(y, yr, reference.attention_softmax_dropout(s, m, causal, SCALE))
    assert_close(y, yr)
    assert_close(ds, x.grad, scale=4)


def test_reference_stream_index_is_the_global_flat_index():
    B, H, Tq, Tk = 2, 5, 7, 11
    full = torch.arange(B * H * Tq * Tk).view(B, H, Tq, Tk) + 1000
    got = stream_index((B, 2, 3, 4), ops.AttentionCoords(H, 1, Tq, 2, Tk, 6), 1000)
    assert torch.equal(got, full[:, 1:3, 2:5, 6:10])
    assert torch.equal(keep_bits(got, 0.5, SEED), reference.keep_mask(full.numel(), 0.5, SEED, 1000).view(
        B, H, Tq, Tk)[:, 1:3, 2:5, 6:10])


def test_rows_and_keys_past_the_totals_are_accepted():
    s = _scores(2, 3, 4, 5, "cpu", torch.float32)
    y, _ = _run(s, None, True, ops.Dropout(0.2, SEED, 0), (1, 7, 1, 9, 1, 11))
    yr = reference.attention_softmax_dropout(s, None, True, SCALE, 0.2, SEED, 0, (1, 7, 1, 9, 1, 11))
    assert_close(y, yr)


@pytest.mark.parametrize("causal", [False, True])
def test_gradcheck_float64_with_coords(causal):
    s = _scores(2, 2, 3, 5, "cpu", torch.float64).requires_grad_()
    m = _pad(2, 5, "cpu")
    coords = [4, 1, 7, 3, 9, 2]
    assert torch.autograd.gradcheck(lambda x: SM(x, m, causal, SCALE, 0.3, SEED, 5, coords), (s,))


@pytest.mark.parametrize("coords,match", [((3, 0, 4), "coords must be 6 ints"), ((2, 0, 3, 0, 4, 0, 1), "coords"),
                                          ((2, -1, 3, 0, 4, 0), "coords must be >= 0"),
                                          ((0, 0, 3, 0, 4, 0), "coords"), ((2, 0, 3, 0, 0, 0), "coords")])
def test_bad_coords_name_the_argument(coords, match):
    s = _scores(1, 2, 3, 4, "cpu", torch.float32)
    with pytest.raises(ValueError, match=match):
        ops.attention_softmax_dropout(s, p=0.1, coords=coords)
    with pytest.raises(ValueError, match=match):
        reference.attention_softmax_dropout(s, p=0.1, coords=coords)
    with pytest.raises(RuntimeError, match="coords"):
        SM(s, None, False, 1.0, 0.1, 1, 0, list(coords))


def test_fake_kernels_take_coords():
    from torch._subclasses.fake_tensor import FakeTensorMode

    O = torch.ops.fairseq_lightseq
    with FakeTensorMode():
        y, out = O.attention_softmax_fwd(torch.empty(2, 4, 3, 5), None, True, 0.5, 0.1, 1, 0, [8, 4, 6, 3, 6, 0])
        ds = O.attention_softmax_bwd(out, y, 0.5, 0.1, 1, 0, [8, 4, 6, 3, 6, 0])
    assert y.shape == out.shape == ds.shape == (2, 4, 3, 5)


# ---- CUDA against the CPU kernel with coordinates (scripts/gpu_check.sh, step tests_rest) ----

@pytest.mark.parametrize("device", CUDA_DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape,coords", [
    ((2, 3, 5, 64), (7, 2, 11, 3, 67, 1)),  # register rows (Tk % 8 == 0), row starts at any lane of a group
    ((2, 3, 5, 61), (5, 1, 9, 2, 66, 5)),  # general kernel, odd Tk
    ((1, 2, 3, 1024), (4, 1, 5, 2, 1025, 1)),  # the longest register row
    ((1, 2, 3, 2048), (2, 0, 3, 0, 2051, 3)),  # general kernel, long row
])
@pytest.mark.parametrize("causal", [False, True])
def test_cuda_equals_cpu_with_coords(device, dtype, shape, coords, causal):
    cpu_dtype = torch.float32 if dtype == torch.float16 else dtype  # no CPU fp16 kernel: fp16 values in fp32
    s, m = _scores(*shape, "cpu", dtype).to(cpu_dtype), _pad(shape[0], shape[3], "cpu", left=True)
    draw = ops.Dropout(0.3, SEED, (1 << 40) + 3)
    g = randn(*shape, dtype=dtype, seed=9).to(cpu_dtype)
    with cpu_kernels():
        y, ds = _run(s, m, causal, draw, coords, grad=g)
        expected_zeros = reference.attention_softmax_dropout(s, m, causal, SCALE)
    yc, dsc = _run(s.to(device, dtype), m.to(device), causal, draw, coords, grad=g.to(device, dtype))
    _same_zeros(yc, y, expected_zeros)
    assert_close(yc.cpu().to(cpu_dtype), y, dtype=dtype, scale=2)
    assert_close(dsc.cpu().to(cpu_dtype), ds, dtype=dtype, scale=4)
