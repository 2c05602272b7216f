"""The one-node sublayers (ops.blocks.attention_block, ops.blocks.feed_forward_block): gradcheck in
float64, and forward/backward equal to the per-op chain (the layers' other path) with the same
dropout draws, for self- and encoder-decoder attention, pre- and post-LN, masks and dropout."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from support.tensors import DEVICE_DTYPES, assert_close, randn
from fairseq_lightseq import ops
from fairseq_lightseq.modules import LSTransformerDecoderLayer, LSTransformerEncoderLayer
from fairseq_lightseq.modules import multihead_attention
from fairseq_lightseq.ops.blocks import AttentionBlockConfig, FeedForwardBlockConfig, attention_block, feed_forward_block

SEED = 987654321


def _attention_inputs(T, S, B, E, cross, seed=0):
    """x [T, B, E], memory [S, B, E] or None, then ln_w, ln_b, wq, bq, wk, bk, wv, bv, wo, bo, all float64."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, B, E, generator=g, dtype=torch.float64)
    memory = torch.randn(S, B, E, generator=g, dtype=torch.float64) if cross else None
    params = [1 + 0.1 * torch.randn(E, generator=g, dtype=torch.float64), 0.1 * torch.randn(E, generator=g,
                                                                                           dtype=torch.float64)]
    for _ in range(4):
        params += [torch.randn(E, E, generator=g, dtype=torch.float64) / E ** 0.5,
                   0.1 * torch.randn(E, generator=g, dtype=torch.float64)]
    return x, memory, params


def _mask(B, T, seed=3):
    """[B, T] bool, True at padding: row 0 unpadded, the others padded at the end, never all padding."""
    m = torch.zeros(B, T, dtype=torch.bool)
    for b in range(1, B):
        m[b, T - b % T:] = True
    return m


@pytest.mark.parametrize("cross", [False, True], ids=["self", "cross"])
@pytest.mark.parametrize("normalize_before", [False, True], ids=["post_ln", "pre_ln"])
@pytest.mark.parametrize("sdpa", [False, True], ids=["explicit", "sdpa"])
@pytest.mark.parametrize("recompute", [False, True], ids=["keep_qkv", "recompute_qkv"])
def test_attention_block_gradcheck(cross, normalize_before, sdpa, recompute):
    T, S, B, E, H = 3, 4, 2, 4, 2
    x, memory, params = _attention_inputs(T, S, B, E, cross)
    causal = not cross
    mask = _mask(B, S if cross else T)
    # SDPA's own dropout draws from torch's generator on every call: gradcheck needs p = 0 there.
    attn_d = ops.NO_DROPOUT if sdpa else ops.draw(0.3, True, SEED, 1)
    cfg = AttentionBlockConfig(H, (E // H) ** -0.5, causal, normalize_before, 1e-5, attn_d, ops.draw(0.2, True, SEED, 2),
                               sdpa, recompute)
    inputs = [x, memory] + params
    inputs = [t.requires_grad_() if t is not None else None for t in inputs]

    def f(x, memory, *ps):
        return attention_block(x, memory, mask, *ps, cfg)

    assert torch.autograd.gradcheck(f, inputs)


def _ffn_params(E, F, g):
    """ln_w, ln_b, w1, b1, w2, b2 (float64); b1 in [0.5, 1.5): relu's kink kept away from the pre-activations
    so that finite differences stay on one side."""
    return [1 + 0.1 * torch.randn(E, generator=g, dtype=torch.float64), 0.1 * torch.randn(E, generator=g, dtype=torch.float64),
            torch.randn(F, E, generator=g, dtype=torch.float64) / 2, 0.5 + torch.rand(F, generator=g, dtype=torch.float64),
            torch.randn(E, F, generator=g, dtype=torch.float64) / 2, 0.1 * torch.randn(E, generator=g, dtype=torch.float64)]


@pytest.mark.parametrize("normalize_before", [False, True], ids=["post_ln", "pre_ln"])
@pytest.mark.parametrize("act", ["relu", "gelu", "gelu_tanh"])
def test_feed_forward_block_gradcheck(normalize_before, act):
    T, B, E, F = 3, 2, 4, 6
    g = torch.Generator().manual_seed(1)
    x = torch.randn(T, B, E, generator=g, dtype=torch.float64)
    ps = _ffn_params(E, F, g)
    cfg = FeedForwardBlockConfig(act, ops.draw(0.3, True, SEED, 3), ops.draw(0.2, True, SEED, 4), normalize_before,
                                 1e-5)
    inputs = [t.requires_grad_() for t in [x] + ps]
    assert torch.autograd.gradcheck(lambda *a: feed_forward_block(*a, cfg), inputs)


def _layer_pair(cls, seed=0, **kw):
    torch.manual_seed(seed)
    layer = cls(16, 4, 24, dropout=0.2, attention_dropout=0.3, activation_dropout=0.25, **kw)
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(0.1 * torch.randn_like(p))  # norms and biases away from their 1 / 0 initialisation
    return layer


def _run(layer, blocks, args, kwargs):
    """Forward + backward through the blocks (True) or the per-op chain (False): (output, grads of
    the inputs that require grad, then of every parameter)."""
    layer._use_blocks = lambda x, packed=False: blocks  # instance attribute: this layer only
    args = [a.detach().clone().requires_grad_() if torch.is_tensor(a) and a.is_floating_point() else a for a in args]
    layer.zero_grad()
    out = layer(*args, **kwargs)
    out = out[0] if isinstance(out, tuple) else out
    out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(5), dtype=out.dtype))
    grads = [a.grad for a in args if torch.is_tensor(a) and a.requires_grad]
    return out.detach(), grads + [p.grad for p in layer.parameters()]


@pytest.mark.parametrize("normalize_before", [False, True], ids=["post_ln", "pre_ln"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("sdpa", ["never", "always", "always_with_attention_dropout"])
@pytest.mark.parametrize("recompute", [False, True], ids=["keep_qkv", "recompute_qkv"])
def test_encoder_layer_blocks_match_per_op_chain(normalize_before, dtype, sdpa, recompute, monkeypatch):
    """Explicit and SDPA attention, q, k, v kept or projected again in backward (SDPA without attention
    dropout then reruns its forward; with it the graph is kept); SDPA's dropout mask comes from torch's
    generator, seeded alike before both runs."""
    monkeypatch.setattr(multihead_attention.LSMultiheadAttention, "attention_mode", "sdpa" if sdpa.startswith("always") else "explicit")
    layer = _layer_pair(LSTransformerEncoderLayer, normalize_before=normalize_before).to(dtype).train()
    layer.recompute_attention = recompute
    if sdpa == "always":
        layer.self_attn.dropout_module.p = 0.0
    x = randn(7, 3, 16, dtype=dtype, seed=1)
    mask = _mask(3, 7)
    kwargs = dict(encoder_padding_mask=mask, dropout_seed=SEED, dropout_site=9)
    torch.manual_seed(11)
    y1, g1 = _run(layer, True, [x], kwargs)
    torch.manual_seed(11)
    y2, g2 = _run(layer, False, [x], kwargs)
    assert_close(y1, y2)
    for a, b in zip(g1, g2):
        assert_close(a, b, scale=10)


@pytest.mark.parametrize("normalize_before", [False, True], ids=["post_ln", "pre_ln"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("recompute", [False, True], ids=["keep_qkv", "recompute_qkv"])
def test_decoder_layer_blocks_match_per_op_chain(normalize_before, dtype, recompute):
    layer = _layer_pair(LSTransformerDecoderLayer, normalize_before=normalize_before).to(dtype).train()
    layer.recompute_attention = recompute
    x = randn(5, 3, 16, dtype=dtype, seed=1)
    enc = randn(6, 3, 16, dtype=dtype, seed=2)
    kwargs = dict(encoder_padding_mask=_mask(3, 6), self_attn_padding_mask=_mask(3, 5), dropout_seed=SEED,
                  dropout_site=17)
    y1, g1 = _run(layer, True, [x, enc], kwargs)
    y2, g2 = _run(layer, False, [x, enc], kwargs)
    assert_close(y1, y2)
    assert len(g1) == len(g2) == 2 + len(list(layer.parameters()))
    for a, b in zip(g1, g2):
        assert_close(a, b, scale=10)


def test_blocks_follow_the_dropout_sites():
    """Same seed and site: the same output; another site or seed: another mask."""
    layer = _layer_pair(LSTransformerEncoderLayer).train()
    x = randn(7, 3, 16, seed=1)
    out = lambda seed, site: layer(x, dropout_seed=seed, dropout_site=site)  # noqa: E731
    a = out(SEED, 1)
    assert torch.equal(a, out(SEED, 1))
    assert not torch.allclose(a, out(SEED, 9))
    assert not torch.allclose(a, out(SEED + 1, 1))


@pytest.mark.parametrize("device,dtype", [p for p in DEVICE_DTYPES if "cuda" in p.id])
def test_blocks_match_per_op_chain_on_cuda(device, dtype):
    layer = _layer_pair(LSTransformerDecoderLayer).to(device=device, dtype=dtype).train()
    layer.self_attn.dropout_module.p = layer.encoder_attn.dropout_module.p = 0.0  # SDPA draws its own masks
    x = randn(5, 3, 16, dtype=dtype, device=device, seed=1)
    enc = randn(6, 3, 16, dtype=dtype, device=device, seed=2)
    kwargs = dict(encoder_padding_mask=_mask(3, 6).to(device), self_attn_padding_mask=_mask(3, 5).to(device),
                  dropout_seed=SEED, dropout_site=1)
    y1, g1 = _run(layer, True, [x, enc], kwargs)
    y2, g2 = _run(layer, False, [x, enc], kwargs)
    assert_close(y1, y2, scale=4)
    for a, b in zip(g1, g2):
        assert_close(a, b, scale=20)


class Record(TorchDispatchMode):
    """Records the name of every op that reaches the dispatcher below autograd."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.__name__.split(".")[0])
        return func(*args, **(kwargs or {}))


def test_explicit_blocks_run_their_compiled_ops(monkeypatch):
    """The equality tests above check the compiled block ops (csrc/ops/blocks.cpp): the explicit
    attention and the FFN run forward and backward as those ops, and the kernels inside them do not
    reach Python."""
    monkeypatch.setattr(multihead_attention.LSMultiheadAttention, "attention_mode", "explicit")
    layer = _layer_pair(LSTransformerDecoderLayer).train()
    x = randn(5, 3, 16, seed=1).requires_grad_()
    enc = randn(6, 3, 16, seed=2).requires_grad_()
    with Record() as rec:
        layer(x, enc, encoder_padding_mask=_mask(3, 6), dropout_seed=SEED)[0].sum().backward()
    calls = [n for n in rec.names if n.endswith(("_block_fwd", "_block_bwd"))]
    assert sorted(calls) == sorted(["attention_block_fwd"] * 2 + ["attention_block_bwd"] * 2 + ["ffn_block_fwd",
                                                                                               "ffn_block_bwd"])
    assert not {"attention_softmax_fwd", "layer_norm_fwd", "mm", "bmm"} & set(rec.names)


@pytest.mark.parametrize("sdpa", [False, True], ids=["explicit", "sdpa"])
def test_attention_block_without_grad_and_twice_backward(sdpa):
    """The block's compiled op under no_grad and inference_mode gives the training forward's output (no
    graph recorded), and a second backward through a retained graph doubles every gradient."""
    T, S, B, E, H = 5, 4, 2, 8, 2
    x, memory, params = _attention_inputs(T, S, B, E, cross=True)
    cfg = AttentionBlockConfig(H, (E // H) ** -0.5, False, False, 1e-5, ops.NO_DROPOUT, ops.draw(0.2, True, SEED, 2),
                               sdpa)
    mask = _mask(B, S)
    inputs = [t.requires_grad_() for t in [x, memory] + params]
    y = attention_block(inputs[0], inputs[1], mask, *inputs[2:], cfg)
    with torch.no_grad():
        y0 = attention_block(x, memory, mask, *params, cfg)
    with torch.inference_mode():
        y1 = attention_block(x, memory, mask, *params, cfg)
    assert y0.grad_fn is None and torch.equal(y0, y.detach()) and torch.equal(y1, y.detach())
    y.sum().backward(retain_graph=True)
    first = [t.grad.clone() for t in inputs]
    y.sum().backward()
    for t, g in zip(inputs, first):
        torch.testing.assert_close(t.grad, 2 * g)


# ---- over packed rows (--ls-packed) ------------------------------------------------------------------------

def _packing(lengths, T, left=False):
    """The Packing of a [B, T] batch with these lengths, padded on the left or right."""
    from fairseq_lightseq.modules import packing

    mask = torch.ones(len(lengths), T, dtype=torch.bool)
    for b, n in enumerate(lengths):
        if left:
            mask[b, T - n:] = False
        else:
            mask[b, :n] = False
    return packing.pack(mask)


@pytest.mark.parametrize("cross", [False, True], ids=["self", "cross"])
@pytest.mark.parametrize("normalize_before", [False, True], ids=["post_ln", "pre_ln"])
@pytest.mark.parametrize("recompute", [False, True], ids=["keep_qkv", "recompute_qkv"])
def test_packed_attention_block_gradcheck(cross, normalize_before, recompute):
    """Sentences of 3, 1 and 2 queries (left-padded to 4) over 2, 3 and 1 keys (cross) or themselves (causal
    self-attention); attention dropout at the padded problem's coordinates, residual dropout over the rows."""
    from fairseq_lightseq.modules import packing
    from fairseq_lightseq.ops.blocks import packed_attention_block

    E, H = 4, 2
    qp = _packing([3, 1, 2], 4, left=True)
    kp = _packing([2, 3, 1], 3) if cross else qp
    x, memory, params = _attention_inputs(qp.N, kp.N, 1, E, cross)
    x = x.view(qp.N, E)
    memory = memory.view(kp.N, E) if cross else None
    cfg = AttentionBlockConfig(H, (E // H) ** -0.5, not cross, normalize_before, 1e-5, ops.draw(0.3, True, SEED, 1),
                               ops.dropout_stream.at_rows(ops.draw(0.2, True, SEED, 2), qp.rows), recompute=recompute)
    inputs = [t.requires_grad_() if t is not None else None for t in [x, memory] + params]

    def f(x, memory, *ps):
        return packed_attention_block(x, memory, qp.cu_seqlens, kp.cu_seqlens, qp.max_len, kp.max_len,
                                      packing.coords(qp, kp), *ps, cfg)

    assert torch.autograd.gradcheck(f, inputs)


@pytest.mark.parametrize("normalize_before", [False, True], ids=["post_ln", "pre_ln"])
def test_feed_forward_block_with_rows_gradcheck_and_padded_rows(normalize_before):
    """Over packed rows [N, E] whose draws carry the row map, the block's output and gradients are the padded
    block's at those rows (its dropout masks are the padded rows'), and its backward passes gradcheck."""
    T, B, E, F = 4, 3, 4, 6
    g = torch.Generator().manual_seed(2)
    x = torch.randn(T, B, E, generator=g, dtype=torch.float64)
    ps = _ffn_params(E, F, g)
    pack = _packing([4, 1, 2], T, left=True)
    drops = (ops.draw(0.3, True, SEED, 3), ops.draw(0.2, True, SEED, 4))
    padded = FeedForwardBlockConfig("gelu", *drops, normalize_before, 1e-5)
    packed = padded._replace(act_dropout=ops.dropout_stream.at_rows(drops[0], pack.rows),
                             dropout=ops.dropout_stream.at_rows(drops[1], pack.rows))
    xs = [x.clone().requires_grad_(), x.view(T * B, E)[pack.rows].clone().requires_grad_()]
    y_padded = feed_forward_block(xs[0], *ps, padded)
    y_packed = feed_forward_block(xs[1], *ps, packed)
    torch.testing.assert_close(y_packed, y_padded.view(T * B, E)[pack.rows], rtol=1e-12, atol=1e-12)
    dy = torch.randn(y_packed.shape, generator=g, dtype=torch.float64)
    y_packed.backward(dy)
    y_padded.backward(torch.zeros(T * B, E, dtype=torch.float64).index_copy(0, pack.rows, dy).view(T, B, E))
    torch.testing.assert_close(xs[1].grad, xs[0].grad.view(T * B, E)[pack.rows], rtol=1e-12, atol=1e-12)
    inputs = [xs[1].detach().requires_grad_()] + [t.requires_grad_() for t in ps]
    assert torch.autograd.gradcheck(lambda *a: feed_forward_block(*a, packed), inputs)


def test_feed_forward_block_refuses_two_row_maps():
    rows = torch.arange(3)
    cfg = FeedForwardBlockConfig("relu", ops.dropout_stream.at_rows(ops.draw(0.3, True, SEED, 3), rows),
                                 ops.dropout_stream.at_rows(ops.draw(0.2, True, SEED, 4), rows.clone()), False, 1e-5)
    x, E = randn(3, 4, dtype=torch.float64), 4
    with pytest.raises(ValueError, match="different row maps"):
        feed_forward_block(x, torch.ones(E, dtype=x.dtype), torch.zeros(E, dtype=x.dtype), torch.ones(6, E, dtype=x.dtype),
                           torch.zeros(6, dtype=x.dtype), torch.ones(E, 6, dtype=x.dtype), torch.zeros(E, dtype=x.dtype),
                           cfg)


def _run_packed(layer, blocks, x, pack, **kwargs):
    """Forward + backward of a layer over packed rows x [N, E], as the one-node blocks or the per-op chain:
    (output, grads of x, of encoder_out if given, then of every parameter)."""
    layer._use_blocks = lambda x, packed=False: blocks
    args = [x.detach().clone().requires_grad_()]
    if "encoder_out" in kwargs:
        kwargs["encoder_out"] = kwargs["encoder_out"].detach().clone().requires_grad_()
    layer.zero_grad()
    out = layer(*args, pack=pack, dropout_seed=SEED, dropout_site=5, **kwargs)
    out = out[0] if isinstance(out, tuple) else out
    out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(5), dtype=out.dtype))
    grads = [args[0].grad] + ([kwargs["encoder_out"].grad] if "encoder_out" in kwargs else [])
    return out.detach(), grads + [p.grad for p in layer.parameters()]


@pytest.mark.parametrize("kind", ["encoder", "decoder"])
@pytest.mark.parametrize("normalize_before", [False, True], ids=["post_ln", "pre_ln"])
@pytest.mark.parametrize("recompute", [False, True], ids=["keep_qkv", "recompute_qkv"])
def test_packed_layer_blocks_match_per_op_chain(kind, normalize_before, recompute):
    """float64, every dropout on: a layer over packed rows gives the same output and gradients as its one-node
    blocks and as the per-op chain (the decoder: causal self-attention and cross-attention over the source's
    left-padded packed rows)."""
    cls = LSTransformerEncoderLayer if kind == "encoder" else LSTransformerDecoderLayer
    layer = _layer_pair(cls, normalize_before=normalize_before).double().train()
    layer.recompute_attention = recompute
    pack = _packing([5, 1, 3], 5)
    x = randn(pack.N, 16, dtype=torch.float64, seed=1)
    kwargs = {}
    if kind == "decoder":
        src = _packing([2, 6, 4], 6, left=True)
        kwargs = dict(encoder_out=randn(src.N, 16, dtype=torch.float64, seed=2), encoder_pack=src)
    y1, g1 = _run_packed(layer, True, x, pack, **kwargs)
    y2, g2 = _run_packed(layer, False, x, pack, **kwargs)
    torch.testing.assert_close(y1, y2, rtol=1e-10, atol=1e-12)
    assert len(g1) == len(g2) == 1 + (kind == "decoder") + len(list(layer.parameters()))
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_packed_blocks_run_their_compiled_ops():
    """A decoder layer over packed rows runs each sublayer as one compiled op forward and backward
    (varlen_attention_block_fwd/_bwd twice, ffn_block_fwd/_bwd once); no kernel of theirs reaches Python."""
    layer = _layer_pair(LSTransformerDecoderLayer).train()
    pack, src = _packing([5, 1, 3], 5), _packing([2, 6, 4], 6, left=True)
    x = randn(pack.N, 16, seed=1).requires_grad_()
    enc = randn(src.N, 16, seed=2).requires_grad_()
    with Record() as rec:
        layer(x, enc, pack=pack, encoder_pack=src, dropout_seed=SEED)[0].sum().backward()
    calls = [n for n in rec.names if n.endswith(("_block_fwd", "_block_bwd"))]
    assert sorted(calls) == sorted(["varlen_attention_block_fwd"] * 2 + ["varlen_attention_block_bwd"] * 2 +
                                   ["ffn_block_fwd", "ffn_block_bwd"])
    assert not {"varlen_attention_fwd", "layer_norm_fwd", "mm", "addmm"} & set(rec.names)
