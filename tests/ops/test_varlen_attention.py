"""varlen_attention: attention over packed rows against the float64 reference, and against the padded attention
op itself (same seed, dropout on): the packed run draws exactly the padded run's masks, whatever side the
padding is on. CUDA cases (marked `cuda`) compare the CUDA kernels with the reference and the CPU kernel."""
import warnings

import pytest
import torch

from support.tensors import CUDA_DEVICES, DEVICE_DTYPES, assert_close, cpu_kernels, randn
from fairseq_lightseq import ops
from fairseq_lightseq.ops import reference
from fairseq_lightseq.ops.varlen_attention import VarlenAttentionFunction

SEED = -4044249281812771813
SCALE = 0.37
O = torch.ops.fairseq_lightseq


def _cu(lengths, device="cpu"):
    return torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device=device)


class Problem:
    """A packed problem: sentence b has lq[b] queries and lk[b] keys; q, k, v random leaves."""

    def __init__(self, lq, lk, H, D, device="cpu", dtype=torch.float32, seed=0):
        self.lq, self.lk, self.H, self.D = lq, lk, H, D
        self.cu_q, self.cu_k = _cu(lq, device), _cu(lk, device)
        self.max_q, self.max_k = max(lq), max(lk)
        self.q = randn(sum(lq), H, D, dtype=dtype, device=device, seed=seed) * 2
        self.k = randn(sum(lk), H, D, dtype=dtype, device=device, seed=seed + 1) * 2
        self.v = randn(sum(lk), H, D, dtype=dtype, device=device, seed=seed + 2)

    def run(self, fn, causal, draw, coords=None, grad=None, cast=None):
        """(out, (dq, dk, dv)) of fn on (a copy of) the inputs, cast to `cast` first if given."""
        x = [t.detach().to(cast or t.dtype).requires_grad_() for t in (self.q, self.k, self.v)]
        y = fn(*x, self.cu_q, self.cu_k, self.max_q, self.max_k, causal, SCALE, draw, coords)
        g = randn(*y.shape, dtype=y.dtype, device=y.device, seed=9) if grad is None else grad.to(y.dtype)
        y.backward(g)
        return y.detach(), tuple(t.grad for t in x)


def _ours(q, k, v, cu_q, cu_k, mq, mk, causal, scale, draw, coords):
    return ops.varlen_attention(q, k, v, cu_q, cu_k, mq, mk, causal, scale, draw, coords=coords)


def _ref(q, k, v, cu_q, cu_k, mq, mk, causal, scale, draw, coords):
    return reference.varlen_attention(q, k, v, cu_q, cu_k, mq, mk, causal, scale, *draw[:3], coords)


# (query lengths, key lengths, causal): encoder self, decoder self (causal), cross (target vs source lengths),
# length-1 sentences, all equal, a batch of one, a long sentence among short ones
CASES = [
    ([5, 3, 7], [5, 3, 7], False),
    ([4, 1, 6], [4, 1, 6], True),
    ([3, 6, 2], [5, 2, 7], False),
    ([1, 1, 1], [1, 4, 1], False),
    ([4, 4, 4], [4, 4, 4], True),
    ([9], [9], True),
    ([2, 37, 1], [2, 37, 1], False),
]


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("lq,lk,causal", CASES)
@pytest.mark.parametrize("D", [8, 5])
@pytest.mark.parametrize("p", [0.0, 0.3])
def test_forward_backward_match_the_float64_reference(device, dtype, lq, lk, causal, D, p):
    pb = Problem(lq, lk, 2, D, device, dtype)
    draw = ops.Dropout(p, SEED, 13)
    y, grads = pb.run(_ours, causal, draw)
    yr, grads_r = pb.run(_ref, causal, draw, cast=torch.float64)
    assert y.dtype == dtype and y.shape == pb.q.shape
    assert_close(y, yr, dtype=dtype, scale=2)
    for g, gr in zip(grads, grads_r):
        assert g.dtype == dtype
        assert_close(g, gr, dtype=dtype, scale=4)


# The CPU kernel's tiles: queries in blocks of 48 rows (16 when causal), keys and head dims padded to whole
# 16-float vectors, GEMM row blocks of 8 / 6 / 3; fp32 with D a multiple of 16 works on the tensors' rows in
# place, other head dims and dtypes on converted copies. Sentences longer than one block (and one key strip),
# a block's last rows, lengths 1 and 16 +- 1, Lq != Lk both ways (causal cross shapes too), head dims
# 20 and 33 (not a multiple of 16 or 8) and 32 (in place).
LONG_CASES = [
    ([1, 100, 49, 48, 17], [1, 100, 49, 48, 17], False),
    ([1, 100, 49, 48, 17], [1, 100, 49, 48, 17], True),
    ([50, 3, 97, 15], [97, 1, 50, 16], False),
    ([50, 3, 97, 15], [97, 1, 50, 16], True),
]


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("lq,lk,causal", LONG_CASES)
@pytest.mark.parametrize("D", [20, 33, 32])
@pytest.mark.parametrize("p", [0.0, 0.2])
def test_sentences_over_the_tile_sizes_match_the_reference(device, dtype, lq, lk, causal, D, p):
    pb = Problem(lq, lk, 2, D, device, dtype, seed=3)
    draw = ops.Dropout(p, SEED, 5)
    y, grads = pb.run(_ours, causal, draw)
    yr, grads_r = pb.run(_ref, causal, draw, cast=torch.float64)
    assert_close(y, yr, dtype=dtype, scale=2)
    for g, gr in zip(grads, grads_r):
        assert_close(g, gr, dtype=dtype, scale=8)  # fp32 sums over up to 100 keys or queries


@pytest.mark.parametrize("lq,lk,causal", [([3, 1, 4], [3, 1, 4], True), ([2, 3], [4, 1], False)])
@pytest.mark.parametrize("p", [0.0, 0.4])
def test_gradcheck_float64(lq, lk, causal, p):
    pb = Problem(lq, lk, 2, 3, dtype=torch.float64)
    q, k, v = (t.detach().requires_grad_() for t in (pb.q, pb.k, pb.v))
    starts = torch.tensor([[1, 0]] * len(lq), dtype=torch.int32)

    def f(q, k, v):
        return VarlenAttentionFunction.apply(q, k, v, pb.cu_q, pb.cu_k, pb.max_q, pb.max_k, causal, SCALE, p, SEED,
                                             5, starts, 9, 6)

    assert torch.autograd.gradcheck(f, (q, k, v))


def test_uses_the_compiled_kernel_on_cpu():
    assert ops.has_kernel("varlen_attention_fwd", "cpu") and ops.has_kernel("varlen_attention_bwd", "cpu")


def test_cpu_float16_runs_the_reference():
    """No CPU float16 kernel: the reference runs (fp32 math, an fp16 result), as for the other op groups."""
    pb = Problem([3, 2], [3, 2], 2, 4, dtype=torch.float16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the once-per-process "no CPU float16 kernels"
        y, _ = pb.run(_ours, True, ops.Dropout(0.2, SEED, 0))
    yr, _ = pb.run(_ref, True, ops.Dropout(0.2, SEED, 0))
    assert y.dtype == torch.float16 and torch.equal(y, yr)


# ---- packed equals padded: the existing attention op on the padded batch, same seed, dropout on ----

def _padded_layout(lengths, T, left):
    """key_padding_mask [B, T] (True = pad) and each sentence's first real position."""
    mask = torch.ones(len(lengths), T, dtype=torch.bool)
    starts = []
    for b, n in enumerate(lengths):
        s = T - n if left else 0
        mask[b, s:s + n] = False
        starts.append(s)
    return mask, starts


def _pad(x, lengths, mask):
    """Packed [N, H, D] -> padded [B, H, T, D] (zeros at pads), differentiable."""
    B, T = mask.shape
    out = x.new_zeros(B, T, *x.shape[1:])
    out = out.index_put((~mask).nonzero(as_tuple=True), x)
    return out.transpose(1, 2)


# (query lengths, key lengths, causal, queries left-padded, keys left-padded)
PADDED = [
    ([5, 2, 6], [5, 2, 6], False, True, True),  # encoder self-attention, fairseq's left-padded source
    ([5, 2, 6], [5, 2, 6], False, False, False),  # --left-pad-source False
    ([4, 1, 7], [4, 1, 7], True, False, False),  # decoder self-attention, right-padded target
    ([4, 1, 7], [4, 1, 7], True, True, True),  # causal over left-padded rows
    ([3, 6, 1], [7, 2, 4], False, False, True),  # cross-attention: right-padded target, left-padded source
    ([3, 6, 1], [7, 2, 4], False, False, False),  # cross-attention, right-padded source
    ([6, 6], [6, 6], True, False, False),  # no padding at all
    ([3], [5], False, False, True),  # a batch of one
    ([60, 2, 49], [60, 2, 49], True, True, True),  # longer than the CPU kernel's 48-query block
    ([50, 7], [61, 3], False, False, True),  # cross-attention over the block, left-padded source
]


@pytest.mark.parametrize("lq,lk,causal,left_q,left_k", PADDED)
@pytest.mark.parametrize("extra", [0, 2])
def test_packed_equals_padded_attention_with_dropout(lq, lk, causal, left_q, left_k, extra):
    """`extra` padding beyond the longest sentence (a batch padded further, as a multiple-of-8 pad does)."""
    H, D = 3, 4
    pb = Problem(lq, lk, H, D, dtype=torch.float64)
    Tq, Tk = max(lq) + extra, max(lk) + extra
    mq, sq = _padded_layout(lq, Tq, left_q)
    mk, sk = _padded_layout(lk, Tk, left_k)
    draw = ops.Dropout(0.35, SEED, 3 << 40)
    coords = ops.VarlenCoords(Tq, Tk, torch.tensor(list(zip(sq, sk)), dtype=torch.int32))
    g = randn(sum(lq), H, D, dtype=torch.float64, seed=4)
    y, grads = pb.run(_ours, causal, draw, coords, grad=g)

    q, k, v = (t.detach().requires_grad_() for t in (pb.q, pb.k, pb.v))
    qp, kp, vp = _pad(q, lq, mq), _pad(k, lk, mk), _pad(v, lk, mk)  # [B, H, T, D]
    scores = torch.matmul(qp, kp.transpose(-1, -2))
    yp = ops.attention_softmax_dropout_bmm(scores, vp, mk, causal, SCALE, draw)  # [B, H, Tq, D]
    y_real = yp.transpose(1, 2)[~mq]  # the real query rows, packed order
    y_real.backward(g)
    torch.testing.assert_close(y, y_real.detach(), rtol=1e-12, atol=1e-12)
    for a, b in zip(grads, (q.grad, k.grad, v.grad)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    # and the dropout did drop: without it the output differs
    y0, _ = pb.run(_ours, causal, ops.Dropout(0.0, SEED, 0), coords)
    assert not torch.allclose(y0, y)


def _mask_probe(lq, lk, H, device, dtype):
    """q random, k = 0 (uniform probabilities 1/n), v one-hot on the key index: out[q0+i, h, j] = keep_ij / n_i
    / (1-p) for the n_i keys query i sees, so (out != 0) is the dropout mask itself."""
    D = max(lk)
    q = randn(sum(lq), H, D, dtype=dtype, device=device)
    k = torch.zeros(sum(lk), H, D, dtype=dtype, device=device)
    v = torch.zeros(sum(lk), H, D, dtype=dtype, device=device)
    ck = _cu(lk)
    for b in range(len(lk)):
        for j in range(lk[b]):
            v[ck[b] + j, :, j] = 1
    return q, k, v


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_mask_is_the_padded_problems_keep_mask(device, dtype, causal):
    lq = lk = [3, 1, 6, 5]
    H, Tq, Tk, p, off = 2, 8, 9, 0.5, 77
    sq, sk = [5, 0, 1, 2], [0, 8, 3, 4]
    q, k, v = _mask_probe(lq, lk, H, device, dtype)
    coords = ops.VarlenCoords(Tq, Tk, torch.tensor(list(zip(sq, sk)), dtype=torch.int32, device=device))
    y = ops.varlen_attention(q, k, v, _cu(lq, device), _cu(lk, device), max(lq), max(lk), causal, 1.0,
                             ops.Dropout(p, SEED, off), coords=coords).cpu()
    full = reference.keep_mask(len(lq) * H * Tq * Tk, p, SEED, off).view(len(lq), H, Tq, Tk)
    cq = _cu(lq)
    for b in range(len(lq)):
        for i in range(lq[b]):
            n = i + 1 if causal else lk[b]
            got = y[cq[b] + i, :, :n] != 0  # [H, n]
            assert torch.equal(got, full[b, :, sq[b] + i, sk[b]:sk[b] + n]), (b, i)
            assert not y[cq[b] + i, :, n:].any()


def test_default_coords_are_right_padding():
    pb = Problem([3, 5], [4, 2], 2, 3)
    draw = ops.Dropout(0.3, SEED, 11)
    starts = torch.zeros(2, 2, dtype=torch.int32)
    y, g = pb.run(_ours, False, draw)
    y2, g2 = pb.run(_ours, False, draw, ops.VarlenCoords(pb.max_q, pb.max_k, starts))
    assert torch.equal(y, y2) and all(torch.equal(a, b) for a, b in zip(g, g2))


@pytest.mark.parametrize("lq,lk,H,D", [
    ([40, 3, 17, 29], [40, 3, 17, 29], 4, 16),
    ([100, 3, 49, 130], [61, 3, 97, 130], 3, 32),  # several query blocks per sentence
])
def test_gradients_do_not_depend_on_thread_count(lq, lk, H, D):
    pb = Problem(lq, lk, H, D)
    n = torch.get_num_threads()
    try:
        outs = []
        for t in (1, max(2, n)):
            torch.set_num_threads(t)
            outs.append(pb.run(_ours, True, ops.Dropout(0.1, SEED, 0)))
    finally:
        torch.set_num_threads(n)
    (y1, g1), (y2, g2) = outs
    assert torch.equal(y1, y2) and all(torch.equal(a, b) for a, b in zip(g1, g2))


def test_a_query_without_keys_gives_zeros():
    """An empty key side (Lk = 0), and causal Lq > Lk, whose first queries see no key."""
    pb = Problem([2, 4], [0, 2], 1, 3)
    y, grads = pb.run(_ours, True, ops.Dropout(0.0, SEED, 0))
    yr, grads_r = pb.run(_ref, True, ops.Dropout(0.0, SEED, 0), cast=torch.float64)
    assert not y[:4].any()  # sentence 0 (no keys), and queries 0, 1 of sentence 1
    assert_close(y, yr, dtype=torch.float32)
    for g, gr in zip(grads, grads_r):
        assert_close(g, gr, dtype=torch.float32)


def _call(q=None, k=None, v=None, cu_q=None, cu_k=None, mq=4, mk=4, starts=None, scale=0.5):
    q = torch.randn(6, 2, 4) if q is None else q
    k = torch.randn(6, 2, 4) if k is None else k
    v = k if v is None else v
    cu = torch.tensor([0, 2, 6], dtype=torch.int32)
    return O.varlen_attention_fwd(q, k, v, cu if cu_q is None else cu_q, cu if cu_k is None else cu_k, mq, mk, False,
                                  scale, 0.1, 1, 0, starts)


@pytest.mark.parametrize("kwargs,match", [
    (dict(q=torch.randn(6, 8)), r"q must be 3-D \[Nq, H, D\]"),
    (dict(k=torch.randn(6, 3, 4)), r"k must have shape \[Nk, 2, 4\]"),
    (dict(v=torch.randn(5, 2, 4)), "v must have shape"),
    (dict(k=torch.randn(6, 2, 4, dtype=torch.float64)), "k has dtype"),
    (dict(q=torch.randn(6, 2, 4).int()), "q must be float32, float64 or bfloat16 on CPU"),
    (dict(cu_q=torch.tensor([0, 2, 6])), "cu_seqlens_q must be int32"),
    (dict(cu_k=torch.tensor([0, 6], dtype=torch.int32)), r"cu_seqlens_k must have shape \[3\]"),
    (dict(cu_q=torch.tensor([0], dtype=torch.int32)), r"cu_seqlens_q must be 1-D \[B\+1\] with B >= 1"),
    (dict(cu_q=torch.tensor([1, 2, 6], dtype=torch.int32)), r"cu_seqlens_q\[0\] must be 0"),
    (dict(cu_k=torch.tensor([0, 4, 3], dtype=torch.int32)), "cu_seqlens_k must be non-decreasing"),
    (dict(cu_q=torch.tensor([0, 2, 5], dtype=torch.int32)), r"cu_seqlens_q\[-1\] must be the row count 6"),
    (dict(mq=3), "sentence 1 has 4 rows in cu_seqlens_q, more than max_seqlen 3"),
    (dict(mk=-1), "max_seqlen_q and max_seqlen_k must be >= 0"),
    (dict(starts=torch.zeros(3, 2, dtype=torch.int32)), r"starts must have shape \[2, 2\]"),
    (dict(starts=torch.full((2, 2), -1, dtype=torch.int32)), "starts must be >= 0"),
    (dict(scale=float("inf")), "scale must be finite"),
])
def test_bad_input_names_the_argument(kwargs, match):
    with pytest.raises(RuntimeError, match=match):
        _call(**kwargs)


def test_bad_dropout_and_lse():
    with pytest.raises(RuntimeError, match=r"dropout p must be in \[0, 1\]"):
        O.varlen_attention_fwd(*[torch.randn(2, 1, 3)] * 3, *[torch.tensor([0, 2], dtype=torch.int32)] * 2, 2, 2,
                               False, 1.0, 1.5, 0, 0)
    q = torch.randn(2, 1, 3)
    cu = torch.tensor([0, 2], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="lse must have shape"):
        O.varlen_attention_bwd(q, q, q, q, q, torch.zeros(2), cu, cu, 2, 2, False, 1.0, 0.0, 0, 0)


def test_traces_under_torch_compile_fake_tensors():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q, k = torch.empty(7, 2, 5), torch.empty(4, 2, 5)
        cu = torch.empty(3, dtype=torch.int32)
        out, lse = O.varlen_attention_fwd(q, k, k, cu, cu, 5, 3, True, 0.5, 0.1, 1, 0)
        dq, dk, dv = O.varlen_attention_bwd(out, q, k, k, out, lse, cu, cu, 5, 3, True, 0.5, 0.1, 1, 0)
    assert out.shape == dq.shape == (7, 2, 5) and lse.shape == (7, 2) and lse.dtype == torch.float32
    assert dk.shape == dv.shape == (4, 2, 5)


# ---- CUDA against the CPU kernel (scripts/gpu_check.sh's test step) ----

@pytest.mark.parametrize("device", CUDA_DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
def test_cuda_masks_equal_the_cpu_kernels(device, dtype, causal):
    lq = lk = [3, 40, 1, 33]
    H, Tq, Tk = 2, 45, 41
    starts = torch.tensor([[0, 38], [5, 1], [44, 0], [0, 8]], dtype=torch.int32)
    q, k, v = _mask_probe(lq, lk, H, "cpu", torch.float32)
    draw = ops.Dropout(0.3, SEED, (1 << 40) + 3)

    def run(device, dt):
        return ops.varlen_attention(*(t.to(device, dt) for t in (q, k, v)), _cu(lq, device), _cu(lk, device), max(lq),
                                    max(lk), causal, 1.0, draw, coords=ops.VarlenCoords(Tq, Tk, starts.to(device)))

    with cpu_kernels():
        expected = run("cpu", torch.float32) != 0
    assert torch.equal(run(device, dtype).cpu() != 0, expected)


# The emulated device takes one head dim per kernel instance with more than one value a lane (33: two, with a
# partial last lane; 128: four; 256: eight), leaving out 64 (two, like 33).
HEAD_DIM_CASES = [pytest.param(device, D, id=f"{name}-{D}", marks=mark)
                  for device, name, mark, dims in [("cuda", "cuda", pytest.mark.cuda, (64, 128, 256, 33)),
                                                    ("cpu", "cuda_emu", pytest.mark.cuda_emulated, (128, 256, 33))]
                  for D in dims]


@pytest.mark.parametrize("device,D", HEAD_DIM_CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_cuda_equals_cpu_at_model_head_dims(device, D, dtype):
    lq, lk = [70, 5, 1, 129], [64, 3, 1, 129]
    dev = Problem(lq, lk, 4, D, device, dtype, seed=2)
    cpu = Problem(lq, lk, 4, D)
    cpu.q, cpu.k, cpu.v = (t.float().cpu() for t in (dev.q, dev.k, dev.v))  # the same (rounded) values
    draw = ops.Dropout(0.1, SEED, 0)
    for causal in (False, True):
        y, g = dev.run(_ours, causal, draw)
        with cpu_kernels():
            yc, gc = cpu.run(_ours, causal, draw, grad=randn(*y.shape, dtype=dtype, seed=9).float())
        # The two devices sum in different orders: rounding grows with the summands, here up to ~30 (q, k ~ 2x
        # randn over 129 keys), so the tolerance scales with the tensor's largest value (both stay as close to
        # the float64 reference as each other).
        assert_close(y.cpu(), yc, dtype=dtype, scale=2 * max(1.0, yc.abs().max().item()))
        for a, b in zip(g, gc):
            assert_close(a.cpu(), b, dtype=dtype, scale=2 * max(1.0, b.abs().max().item()))
