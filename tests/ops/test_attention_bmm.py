"""The attention's probabilities times v in one node (ops.attention_softmax_dropout_bmm) and the dropped
probabilities drawn again from the softmax output (ops.attention_dropout), which lets that node, and the
attention block (ops.blocks.attention_block), keep one [B, H, Tq, Tk] tensor for backward instead of two.
Checked against the reference ops forward and backward, the forward's own dropped probabilities bit for
bit, gradcheck in float64, and by counting what autograd saves."""
import pytest
import torch

from support.tensors import DEVICE_DTYPES, assert_close, randn
from fairseq_lightseq import ops
from fairseq_lightseq.ops import reference
from fairseq_lightseq.ops.attention import AttentionSoftmaxDropoutBmmFunction
from fairseq_lightseq.ops.blocks import AttentionBlockConfig, attention_block

O = torch.ops.fairseq_lightseq
SEED = 424242
SCALE = 0.45

# (B, H, Tq, Tk, hd, padding, causal): tails, a length-1 row, Tq != Tk, a row with no visible key
CASES = [
    (1, 1, 1, 1, 3, False, False),
    (2, 3, 5, 37, 7, True, False),
    (2, 2, 7, 7, 8, False, True),
    (2, 1, 5, 3, 4, False, True),  # Tq > Tk: the first rows see no key -> zeros
    (1, 2, 3, 130, 16, True, True),
    (2, 2, 3, 24, 8, False, True),  # Tk a whole number of 16-byte vectors: attention_dropout's vector path
]
# SP-style coordinates: these scores are heads 1.., queries 4.., keys 0.. of a larger problem
COORDS = [None, ops.AttentionCoords(5, 1, 20, 4, 200, 0)]


def _mask(B, Tk, device, padded):
    if not padded:
        return None
    m = torch.zeros(B, Tk, dtype=torch.bool)
    for b in range(B):
        m[b, max(1, Tk - 2 - 3 * b):] = True
    return m.to(device)


def _ids(c):
    return "x".join(map(str, c[:5])) + ("-pad" if c[5] else "") + ("-causal" if c[6] else "")


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("case", CASES, ids=_ids)
@pytest.mark.parametrize("coords", COORDS, ids=["default", "coords"])
def test_attention_dropout_draws_the_forwards_dropped_probabilities(device, dtype, case, coords):
    B, H, Tq, Tk, _, padded, causal = case
    s = randn(B, H, Tq, Tk, dtype=dtype, device=device, seed=1) * 3
    c = [] if coords is None else list(coords)
    y, out = O.attention_softmax_fwd(s, _mask(B, Tk, device, padded), causal, SCALE, 0.3, SEED, 11, c)
    again = ops.attention_dropout(y, 0.3, SEED, 11, coords)
    assert again.dtype == dtype and again.shape == y.shape
    if dtype in (torch.float32, torch.float64):
        # the forward computes y = e * inv, then out = y * factor: the same two roundings
        assert torch.equal(again, out)
    else:
        # half types: out rounds e * inv * factor once, again rounds y (already rounded) * factor
        assert torch.equal(again != 0, out != 0)
        assert_close(again, out)
    assert torch.equal(again.cpu(), reference.attention_dropout(y.cpu(), 0.3, SEED, 11, coords))


def test_reference_attention_dropout_is_the_softmax_references_dropout():
    s = randn(2, 3, 4, 9, dtype=torch.float64, seed=2)
    coords = ops.AttentionCoords(4, 1, 8, 2, 9, 0)
    probs = reference.attention_softmax_dropout(s, None, True, SCALE, 0.0)
    dropped = reference.attention_softmax_dropout(s, None, True, SCALE, 0.4, SEED, 3, coords)
    assert torch.equal(reference.attention_dropout(probs, 0.4, SEED, 3, coords), dropped)
    assert reference.attention_dropout(probs, 0.0, SEED, 3) is probs


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("case", CASES, ids=_ids)
@pytest.mark.parametrize("p", [0.0, 0.25])
@pytest.mark.parametrize("coords", COORDS, ids=["default", "coords"])
def test_softmax_dropout_bmm_matches_reference(device, dtype, case, p, coords):
    B, H, Tq, Tk, hd, padded, causal = case
    m = _mask(B, Tk, device, padded)
    s = randn(B, H, Tq, Tk, dtype=dtype, device=device, seed=3) * 3
    v = randn(B, H, Tk, hd, dtype=dtype, device=device, seed=4)
    x, xv = s.clone().requires_grad_(), v.clone().requires_grad_()
    xr, xvr = s.clone().requires_grad_(), v.clone().requires_grad_()
    draw = ops.draw(p, True, SEED, 5)
    out = ops.attention_softmax_dropout_bmm(x, xv, m, causal, SCALE, draw, coords=coords)
    probs = reference.attention_softmax_dropout(xr, m, causal, SCALE, *draw[:3], coords)
    ref = torch.matmul(probs, xvr)
    assert out.shape == (B, H, Tq, hd) and out.dtype == dtype
    assert_close(out, ref, scale=4)
    g = randn(B, H, Tq, hd, dtype=dtype, device=device, seed=6)
    out.backward(g)
    ref.backward(g)
    assert_close(x.grad, xr.grad, scale=8)
    assert_close(xv.grad, xvr.grad, scale=8)


@pytest.mark.parametrize("p", [0.0, 0.3])
@pytest.mark.parametrize("causal,padded,coords", [(False, True, None), (True, False, None),
                                                  (True, True, ops.AttentionCoords(3, 1, 9, 2, 7, 1))])
def test_softmax_dropout_bmm_gradcheck_float64(p, causal, padded, coords):
    B, H, Tq, Tk, hd = 2, 2, 4, 6, 3
    s = randn(B, H, Tq, Tk, dtype=torch.float64, seed=7).requires_grad_()
    v = randn(B, H, Tk, hd, dtype=torch.float64, seed=8).requires_grad_()
    m = _mask(B, Tk, "cpu", padded)
    c = [] if coords is None else list(coords)
    assert torch.autograd.gradcheck(
        lambda s, v: AttentionSoftmaxDropoutBmmFunction.apply(s, v, m, causal, SCALE, p, SEED, 9, c), (s, v))


def _saved_shapes(fn, *inputs):
    """Shapes of the tensors autograd saves while fn(*inputs) runs (its forward; backward runs after), but
    the inputs themselves (a view, as matmul's [B*H, Tq, Tk] of a [B, H, Tq, Tk] tensor, counts with its
    own shape)."""
    shapes = []
    ids = {id(t) for t in inputs}

    def pack(t):
        if id(t) not in ids and not isinstance(t, torch.nn.Parameter):
            shapes.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*inputs)
    out.sum().backward()
    return shapes


def test_softmax_dropout_bmm_keeps_one_probability_tensor():
    B, H, Tq, Tk, hd = 2, 3, 5, 6, 4
    s = randn(B, H, Tq, Tk, seed=1).requires_grad_()
    v = randn(B, H, Tk, hd, seed=2).requires_grad_()
    fused = _saved_shapes(lambda s, v: ops.attention_softmax_dropout_bmm(s, v, None, True, SCALE, 0.2), s, v)
    assert fused == [(B, H, Tq, Tk)], fused  # the softmax output (v is an input)
    # the separate op and matmul keep the softmax output and the dropped probabilities (as [B*H, Tq, Tk])
    two = _saved_shapes(lambda s, v: torch.matmul(ops.attention_softmax_dropout(s, None, True, SCALE, 0.2), v), s, v)
    assert sorted(two) == sorted([(B, H, Tq, Tk), (B * H, Tq, Tk), (B * H, Tk, hd)]), two


def _block_saved_shapes(attn_p, **cfg_kw):
    """(T, B, E, H, the shapes a causal pre-LN self-attention block saves), T, B, E, H = 6, 2, 8, 2."""
    T, B, E, H = 6, 2, 8, 2
    g = torch.Generator().manual_seed(0)
    x = torch.randn(T, B, E, generator=g).requires_grad_()
    params = [torch.ones(E), torch.zeros(E)]
    for _ in range(4):
        params += [(torch.randn(E, E, generator=g) / E ** 0.5).requires_grad_(), torch.zeros(E).requires_grad_()]
    cfg = AttentionBlockConfig(H, (E // H) ** -0.5, True, True, 1e-5, ops.draw(attn_p, True, SEED, 1),
                               ops.draw(0.1, True, SEED, 2), **cfg_kw)
    return T, B, E, H, _saved_shapes(lambda x: attention_block(x, None, None, *params, cfg), x)


@pytest.mark.parametrize("attn_p", [0.0, 0.2])
def test_attention_block_keeps_one_probability_tensor(attn_p):
    T, B, E, H, saved = _block_saved_shapes(attn_p)
    assert saved.count((B, H, T, T)) == 1, saved


@pytest.mark.parametrize("sdpa", [False, True], ids=["explicit", "sdpa"])
@pytest.mark.parametrize("recompute", [False, True], ids=["keep_qkv", "recompute_qkv"])
def test_attention_block_keeps_qkv_unless_recompute(sdpa, recompute):
    """q, k, v ([B*H, T, hd] explicit, [B, H, T, hd] SDPA) and the merged heads / SDPA's output are kept
    for backward, or (recompute, without attention dropout) none of them."""
    T, B, E, H, saved = _block_saved_shapes(0.0, sdpa=sdpa, recompute=recompute)
    heads = [(B, H, T, E // H)] if sdpa else [(B * H, T, E // H)]
    n_heads = sum(saved.count(s) for s in heads)
    merged = saved.count((T * B, E))
    if recompute:
        assert n_heads == 0 and merged == 0, saved
    else:
        assert n_heads >= 3 and (sdpa or merged == 1), saved


def test_attention_dropout_bad_input_names_the_argument():
    with pytest.raises(RuntimeError, match="attention_dropout: y must be 4-D"):
        O.attention_dropout(randn(2, 3, 4), 0.1, 1, 0)
    with pytest.raises(RuntimeError, match="dropout p must be in"):
        O.attention_dropout(randn(1, 2, 3, 4), 1.5, 1, 0)
    with pytest.raises(RuntimeError, match="coords must be"):
        O.attention_dropout(randn(1, 2, 3, 4), 0.1, 1, 0, [1, 2])


def test_attention_dropout_without_dropout_is_a_copy_and_traces_under_fake_tensors():
    from torch._subclasses.fake_tensor import FakeTensorMode

    y = randn(1, 2, 3, 4)
    c = O.attention_dropout(y, 0.0, 1, 0)
    assert torch.equal(c, y) and c.data_ptr() != y.data_ptr()
    assert ops.has_kernel("attention_dropout", "cpu")
    with FakeTensorMode():
        out = O.attention_dropout(torch.empty(2, 3, 4, 5), 0.1, 1, 0)
    assert out.shape == (2, 3, 4, 5)
