"""embedding: token lookup * scale + positions + dropout, the kernels against the reference and fairseq; with a
row map (packed tokens), the padded call's rows."""
import pytest
import torch

from support.packing import packed_rows, padding_mask
from support import device_assert
from support.tensors import CUDA_DEVICES, DEVICE_DTYPES, assert_close, assert_same_or_close, cpu_kernels, randn
from fairseq_lightseq import ops
from fairseq_lightseq.ops import dropout_stream, reference
from fairseq_lightseq.ops.embedding import EmbeddingFunction

PAD = 1
# (B, T, E, V): odd hidden sizes, T=1, batch 1; small V so that tokens repeat.
SHAPES = [(1, 1, 7, 11), (3, 11, 129, 50), (2, 17, 512, 300), (1, 6, 512, 9), (4, 1, 129, 40)]
LAYOUTS = ["right", "left", "none", "all_pad_row", "repeated"]
# (positions, p): sinusoidal table / learned positions / none, with and without dropout.
# (The kernels do not tell a sinusoidal table from a learned one; only whether pos_weight wants a gradient.)
MODES = [("sinusoidal", 0.0), ("sinusoidal", 0.1), ("learned", 0.25), ("none", 0.1), ("none", 0.0)]


def _tokens(b, t, v, layout, seed=0):
    """[B, T] int64 in [2, V) with padding laid out as fairseq batches are (left or right padded)."""
    g = torch.Generator().manual_seed(seed)
    hi = 4 if layout == "repeated" else v
    tok = torch.randint(2, max(hi, 3), (b, t), generator=g)
    lengths = torch.randint(1, t + 1, (b,), generator=g)
    lengths[0] = t  # the longest row is unpadded, as in a real batch
    for i in range(b):
        n = int(lengths[i])
        if layout == "right":
            tok[i, n:] = PAD
        elif layout == "left":
            tok[i, : t - n] = PAD
    if layout == "all_pad_row":
        tok[-1] = PAD
    return tok


def _tables(v, e, pos_mode, max_pos, device, dtype, seed=0):
    w = randn(v, e, dtype=dtype, device=device, seed=seed, requires_grad=True)
    if pos_mode == "none":
        return w, None
    if pos_mode == "sinusoidal":
        from fairseq.modules import SinusoidalPositionalEmbedding

        pw = SinusoidalPositionalEmbedding.get_embedding(max_pos, e, PAD).to(device=device, dtype=dtype)
    else:
        pw = randn(max_pos, e, dtype=dtype, device=device, seed=seed + 1, requires_grad=True)
    return w, pw


def _f64(t):
    return None if t is None else t.detach().double().requires_grad_(t.requires_grad)


def _run_kernel(tok, w, pw, scale, p, seed, positions=None):
    if pw is not None and positions is None:
        positions = reference.make_positions(tok, PAD)
    return EmbeddingFunction.apply(tok, w, pw, positions, PAD, scale, p, seed)


def _grads(y, w, pw, dy):
    inputs = [w] + ([pw] if pw is not None and pw.requires_grad else [])
    return torch.autograd.grad(y, inputs, dy)


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("mode", MODES, ids=lambda m: f"{m[0]}-p{m[1]}")
def test_forward_backward_match_reference(device, dtype, shape, layout, mode):
    b, t, e, v = shape
    pos_mode, p = mode
    tok = _tokens(b, t, v, layout).to(device)
    w, pw = _tables(v, e, pos_mode, t + PAD + 1, device, dtype)
    scale = e**0.5
    y = _run_kernel(tok, w, pw, scale, p, seed=1234)
    # The reference in float64 from the same stored values: the kernel should be within one rounding.
    w64, pw64 = _f64(w), _f64(pw)
    yr = reference.embedding(tok, w64, pw64, PAD, scale, p, seed=1234)
    assert y.dtype == dtype and y.shape == (b, t, e)
    assert_close(y, yr, dtype=dtype, scale=2)
    assert torch.equal(y == 0, yr == 0), "dropout mask or pad zeros differ from the reference"
    dy = randn(b, t, e, dtype=dtype, device=device, seed=7)
    got = _grads(y, w, pw, dy)
    want = _grads(yr, w64, pw64, dy.double())
    # A table row sums the gradients of every token that looks it up: more rounding for repeated tokens.
    count = max(1, int(torch.bincount(tok.flatten().cpu()).max()))
    for g, r in zip(got, want):
        assert g.dtype == dtype
        assert_close(g, r, dtype=dtype, scale=4 * count**0.5)
    assert torch.all(got[0][PAD] == 0), "pad tokens must give no gradient"
    if len(got) > 1:
        assert torch.all(got[1][PAD] == 0), "pad positions must give no gradient"


@pytest.mark.parametrize("layout", ["right", "left", "all_pad_row"])
def test_forward_bitwise_equals_reference_fp32_cpu(layout):
    tok = _tokens(3, 13, 30, layout)
    w, pw = _tables(30, 129, "learned", 13 + PAD + 1, "cpu", torch.float32)
    y = _run_kernel(tok, w, pw, 11.3, 0.3, seed=99)
    assert torch.equal(y, reference.embedding(tok, w, pw, PAD, 11.3, 0.3, seed=99))


@pytest.mark.parametrize("offset", [1, 3, 6, 2**35 + 5])
@pytest.mark.parametrize("e", [7, 129])
def test_dropout_offset_matches_reference(offset, e):
    """A draw that starts inside a Philox block (offset % 4 != 0, rows of odd width) and past 2^32 blocks (hi counter word)."""
    tok = _tokens(3, 5, 20, "left")
    w, pw = _tables(20, e, "learned", 5 + PAD + 1, "cpu", torch.float64)
    positions = reference.make_positions(tok, PAD)
    y = EmbeddingFunction.apply(tok, w, pw, positions, PAD, 1.5, 0.4, 2024, offset)
    yr = reference.embedding(tok, w, pw, PAD, 1.5, 0.4, 2024, offset)
    assert torch.equal(y, yr)
    dy = randn(*y.shape, dtype=torch.float64, seed=1)
    for g, r in zip(_grads(y, w, pw, dy), _grads(yr, w, pw, dy)):
        assert_close(g, r)


@pytest.mark.parametrize("offset", [0, 3, 2**35 + 5])
def test_dropout_drawn_for_blocks_of_rows_matches_reference(offset):
    """The forward draws the factors of up to 4096 elements of rows at once: 640 rows of 33, at most
    2 threads' chunks of 320 rows, split into blocks of 124 rows, whose starts are mid Philox group
    (odd width, offset % 4 != 0)."""
    tok = _tokens(16, 40, 20, "left")
    w, pw = _tables(20, 33, "learned", 40 + PAD + 1, "cpu", torch.float32)
    positions = reference.make_positions(tok, PAD)
    y = EmbeddingFunction.apply(tok, w, pw, positions, PAD, 1.5, 0.4, 2024, offset)
    assert torch.equal(y, reference.embedding(tok, w, pw, PAD, 1.5, 0.4, 2024, offset))


@pytest.mark.parametrize("learned", [False, True], ids=["sinusoidal", "learned"])
@pytest.mark.parametrize("layout", ["right", "left"])
def test_matches_fairseq_embedding_path(learned, layout):
    """fairseq's TransformerEncoder: embed_scale * embed_tokens(x) + embed_positions(x) (dropout 0)."""
    from fairseq.models.transformer import Embedding
    from fairseq.modules import PositionalEmbedding, SinusoidalPositionalEmbedding

    torch.manual_seed(0)
    b, t, e, v, max_positions = 4, 9, 64, 23, 16
    tok = _tokens(b, t, v, layout)
    embed_tokens = Embedding(v, e, PAD)
    embed_positions = PositionalEmbedding(max_positions, e, PAD, learned=learned)
    scale = e**0.5
    want = scale * embed_tokens(tok) + embed_positions(tok)
    if learned:
        pos_weight = embed_positions.weight
    else:
        pos_weight = SinusoidalPositionalEmbedding.get_embedding(max_positions + PAD + 1, e, PAD)
        assert torch.equal(pos_weight, embed_positions.weights)
    w = embed_tokens.weight.detach().clone().requires_grad_()
    pw = pos_weight.detach().clone().requires_grad_(learned)
    got = ops.embedding(tok, w, pw, PAD, scale, p=0.0)
    assert_close(got, want)
    dy = randn(b, t, e, seed=3)
    want.backward(dy)
    got.backward(dy)
    assert_close(w.grad, embed_tokens.weight.grad, scale=4)
    if learned:
        assert_close(pw.grad, embed_positions.weight.grad, scale=4)


def test_incremental_decoding_positions():
    """One decoder step: fairseq passes position padding_idx + step for every sentence."""
    tok = torch.tensor([[5], [7], [5]])
    w, pw = _tables(10, 33, "learned", 20, "cpu", torch.float32)
    positions = torch.full_like(tok, PAD + 6)
    y = ops.embedding(tok, w, pw, PAD, 2.0, p=0.0, positions=positions)
    assert torch.equal(y, reference.embedding(tok, w, pw, PAD, 2.0, positions=positions))
    y.sum().backward()
    assert torch.equal(pw.grad.nonzero()[:, 0].unique(), torch.tensor([PAD + 6]))


@pytest.mark.parametrize("with_pos", [False, True])
def test_gradcheck_float64(with_pos):
    tok = torch.tensor([[2, 3, 2, 4, PAD], [PAD, PAD, 3, 3, 2]])
    w = randn(6, 5, dtype=torch.float64, seed=1, requires_grad=True)
    pw = randn(8, 5, dtype=torch.float64, seed=2, requires_grad=True)
    positions = reference.make_positions(tok, PAD)
    if with_pos:
        fn = lambda w, pw: EmbeddingFunction.apply(tok, w, pw, positions, PAD, 1.7, 0.3, 42)  # noqa: E731
        assert torch.autograd.gradcheck(fn, (w, pw))
    else:
        fn = lambda w: EmbeddingFunction.apply(tok, w, None, None, PAD, 1.7, 0.3, 42)  # noqa: E731
        assert torch.autograd.gradcheck(fn, (w,))


def _big_case(device="cpu"):
    tok = _tokens(16, 64, 20, "right", seed=5).to(device)  # 1024 tokens, 18 distinct ids: heavy repetition
    w, pw = _tables(20, 96, "learned", 64 + PAD + 1, device, torch.float32, seed=5)
    dy = randn(16, 64, 96, seed=6).to(device)
    return tok, w, pw, dy


def _grads_of_run(tok, w, pw, dy):
    y = _run_kernel(tok, w, pw, 9.8, 0.1, seed=77)
    return [g.clone() for g in _grads(y, w, pw, dy)]


def test_gradients_bitwise_identical_across_runs_and_thread_counts():
    tok, w, pw, dy = _big_case()
    first = _grads_of_run(tok, w, pw, dy)
    assert all(torch.equal(a, b) for a, b in zip(first, _grads_of_run(tok, w, pw, dy)))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        single = _grads_of_run(tok, w, pw, dy)
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(first, single))


def test_dropout_kept_fraction_and_seeding():
    tok = _tokens(8, 64, 1000, "none")
    w, pw = _tables(1000, 256, "sinusoidal", 64 + PAD + 1, "cpu", torch.float32)
    p = 0.3
    y = _run_kernel(tok, w, pw, 16.0, p, seed=5)
    n = y.numel()
    kept = int((y != 0).sum())
    sd = (n * p * (1 - p)) ** 0.5
    assert abs(kept - n * (1 - p)) < 5 * sd
    assert torch.equal(y, _run_kernel(tok, w, pw, 16.0, p, seed=5))
    assert not torch.equal(y, _run_kernel(tok, w, pw, 16.0, p, seed=6))
    # The public function draws its seed from torch's generator: manual_seed reproduces it.
    torch.manual_seed(3)
    a = ops.embedding(tok, w, pw, PAD, 16.0, p=p)
    torch.manual_seed(3)
    assert torch.equal(a, ops.embedding(tok, w, pw, PAD, 16.0, p=p))
    torch.manual_seed(3)
    assert torch.equal(a, reference.embedding(tok, w, pw, PAD, 16.0, p, ops.next_seed()))
    # Eval mode and p=0 are the plain lookup; p=1 drops everything.
    plain = _run_kernel(tok, w, pw, 16.0, 0.0, seed=0)
    assert torch.equal(ops.embedding(tok, w, pw, PAD, 16.0, p=p, training=False), plain)
    assert torch.equal(_run_kernel(tok, w, pw, 16.0, 1.0, seed=5), torch.zeros_like(plain))


def test_uses_the_compiled_kernel_on_cpu():
    assert ops.has_kernel("embedding_fwd", "cpu") and ops.has_kernel("embedding_bwd", "cpu")


def test_frozen_weight_only_position_gradient():
    tok = _tokens(2, 5, 10, "right")
    w, pw = _tables(10, 8, "learned", 12, "cpu", torch.float32)
    w.requires_grad_(False)
    ops.embedding(tok, w, pw, PAD, 2.0).sum().backward()
    assert w.grad is None and pw.grad is not None and pw.grad.shape == pw.shape


def test_empty_batch():
    tok = torch.empty(0, 4, dtype=torch.long)
    w, pw = _tables(10, 8, "learned", 12, "cpu", torch.float32)
    y = ops.embedding(tok, w, pw, PAD, 2.0)
    y.sum().backward()
    assert y.shape == (0, 4, 8) and torch.equal(w.grad, torch.zeros_like(w))


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda w, pw: dict(tokens=torch.tensor([[2, 10]])), r"token id 10 exceeds num_embeddings 10"),
        (lambda w, pw: dict(tokens=torch.tensor([[2, -3]])), r"token id -3 is negative"),
        (lambda w, pw: dict(tokens=torch.tensor([[2, 3]]), positions=torch.tensor([[2, 12]])),
         r"position 12 exceeds max positions 12"),
        (lambda w, pw: dict(tokens=torch.tensor([[2, 3]]), positions=torch.tensor([[2, -1]])),
         r"position -1 is negative"),
        (lambda w, pw: dict(tokens=torch.tensor([[2, 3]]), pos_weight=pw.double()), r"pos_weight has dtype"),
        (lambda w, pw: dict(tokens=torch.tensor([[2, 3]], dtype=torch.int32)), r"tokens must be int64"),
        (lambda w, pw: dict(tokens=torch.tensor([[2, 3]]), positions=torch.tensor([[2, 3, 4]])),
         r"positions must have shape"),
        (lambda w, pw: dict(tokens=torch.tensor([[2, 3]]), weight=w.int()), r"weight must be float32"),
        (lambda w, pw: dict(tokens=torch.tensor([[2, 3]]), pos_weight=pw[:, :5]), r"pos_weight must be"),
    ],
)
def test_bad_input_names_the_argument(make, match):
    w, pw = _tables(10, 8, "learned", 12, "cpu", torch.float32)
    args = dict(weight=w, pos_weight=pw)
    args.update(make(w, pw))
    with pytest.raises(RuntimeError, match=match):
        ops.embedding(args["tokens"], args["weight"], args["pos_weight"], PAD, 2.0, positions=args.get("positions"))


def test_long_sequence_error_message():
    """The example of the brief: a 1030-token sentence against a 1026-row table."""
    tok = torch.full((1, 1030 - PAD), 5)
    w, pw = _tables(10, 8, "learned", 1026, "cpu", torch.float32)
    with pytest.raises(RuntimeError, match="position 1030 exceeds max positions 1026"):
        ops.embedding(tok, w, pw, PAD, 1.0)


def test_traces_under_torch_compile_fake_tensors():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        tok = torch.empty(3, 5, dtype=torch.long)
        y = torch.ops.fairseq_lightseq.embedding_fwd(tok, torch.empty(50, 64), torch.empty(20, 64), tok, PAD, 8.0,
                                                     0.1, 1, 0)
        dw, dp = torch.ops.fairseq_lightseq.embedding_bwd(y, tok, tok, 50, 0, PAD, 8.0, 0.1, 1, 0)
        rows = torch.empty(15, dtype=torch.int64)
        yr = torch.ops.fairseq_lightseq.embedding_fwd(tok, torch.empty(50, 64), None, None, PAD, 8.0, 0.1, 1, 0, rows)
    assert yr.shape == (3, 5, 64)
    assert y.shape == (3, 5, 64) and dw.shape == (50, 64) and dp.shape == (0, 64)


@pytest.mark.parametrize("device", CUDA_DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_matches_cpu_kernel_and_is_deterministic(device, dtype):
    tok, w, pw, dy = _big_case()
    w, pw, dy = (x.detach().to(dtype).requires_grad_() for x in (w, pw, dy))
    with cpu_kernels():
        y_cpu = _run_kernel(tok, w, pw, 9.8, 0.1, seed=77)
        g_cpu = _grads(y_cpu, w, pw, dy)
    wc, pwc = (x.detach().to(device).requires_grad_() for x in (w, pw))
    y = _run_kernel(tok.to(device), wc, pwc, 9.8, 0.1, seed=77)
    assert torch.equal((y == 0).cpu(), y_cpu == 0), "CUDA and CPU dropout masks differ"
    assert_close(y.cpu(), y_cpu, scale=2)
    g1 = _grads(y, wc, pwc, dy.to(device))
    y2 = _run_kernel(tok.to(device), wc, pwc, 9.8, 0.1, seed=77)
    g2 = _grads(y2, wc, pwc, dy.to(device))
    assert all(torch.equal(a, b) for a, b in zip(g1, g2))
    for a, b in zip(g1, g_cpu):
        assert_close(a.cpu(), b, scale=40)


_BAD_ID_CHILD = """
from fairseq_lightseq import ops
assert _backend.use_kernel("embedding_fwd", DEVICE), "no embedding kernel"
tok = torch.tensor({tokens}, device=DEVICE)
w = torch.randn(10, 8, device=DEVICE)
if "{op}" == "fwd":
    pw = torch.randn(12, 8, device=DEVICE)
    ops.embedding(tok, w, pw, {pad}, 2.0, positions={positions})
else:
    grad = torch.randn(*tok.shape, 8, device=DEVICE)
    torch.ops.fairseq_lightseq.embedding_bwd(grad, tok, {positions}, 10, {num_pos}, {pad}, 2.0, 0.1, 1, 0)
if DEVICE == "cuda":
    torch.cuda.synchronize()
print("NO ERROR")
"""


@pytest.mark.parametrize("device", CUDA_DEVICES)
@pytest.mark.parametrize("op", ["fwd", "bwd"])
@pytest.mark.parametrize(
    "tokens,positions,match",
    [
        ("[[2, 10]]", "None", "token id 10 exceeds num_embeddings 10"),
        ("[[2, -3]]", "None", "token id -3 is negative"),
        ("[[2, 3]]", "torch.tensor([[2, 12]], device=DEVICE)", "position 12 exceeds max positions 12"),
    ],
)
def test_cuda_bad_token_names_the_limit(device, op, tokens, positions, match):
    """On CUDA the ids are checked inside the kernels (a host-side check would sync the stream on every
    call): a bad id prints the id and the limit and fails a device assert (support.device_assert)."""
    if positions == "None":
        positions = "None" if op == "bwd" else "torch.tensor([[2, 3]], device=DEVICE)"
    code = _BAD_ID_CHILD.format(tokens=tokens, positions=positions, op=op, pad=PAD,
                                num_pos=0 if positions == "None" else 12)
    failed, out = device_assert.run(code, device)
    assert failed and "NO ERROR" not in out, out[-3000:]
    assert match in out, out[-3000:]


# ---- packed rows: the real tokens of a time-major [T, B] batch, with the row map of their padded rows ----

def _time_major_batch(T, B, layout, device, seed=0):
    """Tokens [T, B] in [2, 20) with pad tokens where the padding mask says, and fairseq's positions of
    the padded tokens (the packed model computes them before packing)."""
    pad = padding_mask(T, B, layout, seed=seed)
    tok = torch.randint(2, 20, (T, B), generator=torch.Generator().manual_seed(seed)).masked_fill(pad, PAD)
    positions = reference.make_positions(tok.t(), PAD).t().contiguous()
    return tok.to(device), positions.to(device), pad


def _packed(t, rows):
    """The packed [R, 1] tokens or positions of a [T, B] tensor (R rows of E in the output)."""
    return t.reshape(-1)[rows].view(-1, 1)


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("e", [7, 13])
@pytest.mark.parametrize("layout", ["left", "right"])
@pytest.mark.parametrize("pos_mode", ["learned", "none"])
def test_packed_call_equals_the_padded_call_at_its_rows(device, dtype, e, layout, pos_mode):
    T, B = 6, 3
    tok, positions, pad = _time_major_batch(T, B, layout, device, seed=e)
    rows = packed_rows(pad).to(device)
    w, pw = _tables(20, e, pos_mode, T + PAD + 1, device, dtype)
    d = ops.Dropout(0.3, 77, (2 << 40) + 1)
    y = ops.embedding(tok, w, pw, PAD, e**0.5, d, positions=positions)
    yp = ops.embedding(_packed(tok, rows), w, pw, PAD, e**0.5, dropout_stream.at_rows(d, rows),
                       positions=_packed(positions, rows))
    assert yp.shape == (rows.numel(), 1, e)
    assert_same_or_close(yp.view(-1, e), y.view(-1, e)[rows])
    g = randn(T, B, e, dtype=dtype, device=device, seed=4)
    # pad tokens give no gradient, so the padded call's gradient is the real tokens' (summed in another order)
    for got, full in zip(_grads(yp, w, pw, g.view(-1, e)[rows].view(-1, 1, e)), _grads(y, w, pw, g)):
        assert_close(got, full, scale=4)


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_identity_row_map_is_the_op_without_rows(device, dtype):
    tok, positions, pad = _time_major_batch(5, 4, "none", device)
    rows = torch.arange(tok.numel(), device=device)
    assert torch.equal(packed_rows(pad).sort().values, rows.cpu())
    w, pw = _tables(20, 13, "learned", 5 + PAD + 1, device, dtype)
    d = ops.Dropout(0.4, 77, 5)
    y = ops.embedding(tok, w, pw, PAD, 2.0, d, positions=positions)
    yr = ops.embedding(tok, w, pw, PAD, 2.0, dropout_stream.at_rows(d, rows), positions=positions)
    assert_same_or_close(yr, y)
    g = randn(*y.shape, dtype=dtype, device=device, seed=2)
    for a, b in zip(_grads(yr, w, pw, g), _grads(y, w, pw, g)):
        assert_same_or_close(a, b)


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("rows", [[], [17]], ids=["R0", "R1"])
def test_zero_and_one_packed_rows(device, dtype, rows):
    tok, positions, _ = _time_major_batch(6, 3, "none", device)
    rows = torch.tensor(rows, dtype=torch.int64, device=device)
    w, pw = _tables(20, 7, "learned", 6 + PAD + 1, device, dtype)
    d = ops.Dropout(0.5, 77, 0)
    y = ops.embedding(tok, w, pw, PAD, 1.0, d, positions=positions)
    yp = ops.embedding(_packed(tok, rows), w, pw, PAD, 1.0, dropout_stream.at_rows(d, rows),
                       positions=_packed(positions, rows))
    assert yp.shape == (rows.numel(), 1, 7)
    assert_same_or_close(yp.view(-1, 7), y.view(-1, 7)[rows])
    dw, dp = _grads(yp, w, pw, torch.ones_like(yp))
    assert dw.shape == w.shape and dp.shape == pw.shape
    if rows.numel() == 0:
        assert not dw.any() and not dp.any()


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("offset", [0, 3, 2**35 + 5])
@pytest.mark.parametrize("e", [13, 16])
def test_row_map_kernel_matches_reference(device, dtype, offset, e):
    """Any row map (unsorted, repeated, far rows) against the reference, forward and backward; the
    tokens [2, 3] lay the rows out as b * T + t. Width 16 at offset 0 takes the CUDA vector paths."""
    tok = torch.tensor([[2, 5, PAD], [5, 3, 2]], device=device)
    positions = reference.make_positions(tok, PAD)
    rows = torch.tensor([7, 0, 2, 2, 1 << 30, 9], dtype=torch.int64, device=device)
    w, pw = _tables(8, e, "learned", 6, device, dtype)
    d = ops.Dropout(0.3, 77, offset, rows)
    y = ops.embedding(tok, w, pw, PAD, 1.5, d, positions=positions)
    w64, pw64 = _f64(w), _f64(pw)
    yr = reference.embedding(tok, w64, pw64, PAD, 1.5, d.p, d.seed, d.offset, positions=positions, rows=rows)
    assert_close(y, yr, dtype=dtype, scale=2)
    assert torch.equal(y == 0, yr == 0) and (yr[tok != PAD] == 0).any()
    g = randn(*y.shape, dtype=dtype, device=device, seed=3)
    for a, b in zip(_grads(y, w, pw, g), _grads(yr, w64, pw64, g.double())):
        assert_close(a, b, dtype=dtype, scale=4)


def test_rows_run_the_compiled_kernel_and_keep_only_the_row_map():
    tok = torch.tensor([[2, 3, PAD]])
    w, pw = _tables(10, 8, "learned", 12, "cpu", torch.float32)
    rows = torch.tensor([5, 1, 0])
    y = ops.embedding(tok, w, pw, PAD, 1.0, ops.Dropout(0.3, 1, 0, rows))
    assert type(y.grad_fn).__name__ == EmbeddingFunction.__name__ + "Backward"
    assert any(t is rows for t in y.grad_fn.saved_tensors)


def test_gradcheck_with_rows_float64():
    tok = torch.tensor([[2, 3, 2, 4, PAD], [PAD, PAD, 3, 3, 2]])
    w = randn(6, 5, dtype=torch.float64, seed=1, requires_grad=True)
    pw = randn(8, 5, dtype=torch.float64, seed=2, requires_grad=True)
    positions = reference.make_positions(tok, PAD)
    d = ops.Dropout(0.3, 42, 1, torch.tensor([9, 0, 4, 3, 12, 1, 2, 5, 7, 30]))
    assert torch.autograd.gradcheck(lambda w, pw: ops.embedding(tok, w, pw, PAD, 1.7, d, positions=positions), (w, pw))


@pytest.mark.parametrize("rows,match", [
    (torch.tensor([0, 1], dtype=torch.int32), "rows must be a 1-D int64"),
    (torch.tensor([0, 1, 2]), "3 rows"),
    (torch.tensor([[0, 1]]), "rows must be a 1-D int64"),
])
def test_bad_row_map_names_rows(rows, match):
    w, pw = _tables(10, 8, "learned", 12, "cpu", torch.float32)
    with pytest.raises((ValueError, RuntimeError), match=match):
        ops.embedding(torch.tensor([[2, 3]]), w, pw, PAD, 1.0, ops.Dropout(0.3, 1, 0, rows))
