"""A whole attention sublayer as ONE autograd node: [layer norm] -> q/k/v GEMMs -> bias + head split
-> attention (scale + masks + softmax + dropout, or torch SDPA) -> head merge -> output GEMM
-> bias + dropout + residual -> [layer norm].

Why one node rather than the per-op Functions of ops/attention.py, ops/dropout.py, ops/layer_norm.py:
on a GPU every autograd node, Python frame and dispatcher hop costs host time whatever the kernel's
size, and a layer built from per-op Functions and `F.linear` records ~20 nodes (plus views, casts
and their backward nodes). Here the explicit attention's forward and backward are one compiled op each
(`attention_block_fwd`/`_bwd`, csrc/ops/blocks.cpp: the GEMMs, views and fused ops called from C++,
about 1.5-5 us per tensor call less than from Python); the SDPA path (CUDA) runs in one Python frame
that calls the GEMMs and `torch.ops.fairseq_lightseq.*` directly. The per-op Functions stay the reference for
this composition (tests compare the two) and serve what this path does not (autocast, devices or
dtypes without kernels, incremental decoding, attention weights).

Saved for backward: the block input, the layer norm statistics (post-LN: its input too;
pre-LN recomputes its normalised input), and, for the explicit attention, the softmax output and the
dropped probabilities: the explicit path is the CPU's (and CUDA's fallback), where the softmax
kernel is the costliest step of the block and host time decides, so the softmax is not recomputed;
the merged heads (the output GEMM's input, [Tq, B, E]) are, from the probabilities and v (one bmm
and one copy). With SDPA (CUDA's path) nothing [B, H, Tq, Tk] is kept: SDPA saves its output and
logsumexp, and the merged heads are rebuilt from its output. The explicit path does not keep q, k, v
either: its backward projects them again from the block input (one GEMM per attention for 3 [B*H, T, hd]
tensors, about a fifth of a layer's saved bytes); SDPA's own node keeps them on that path. The
concatenated q/k/v weight is built in forward and again in backward (a [3E, E] copy) rather than saved,
so it always matches the current parameters.
"""
from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F

from .. import _backend
from . import norm as block_norm
from .._backend import Dropout


class AttentionBlockConfig(NamedTuple):
    """The non-tensor arguments of one attention block.

    num_heads: H; scale: the q.k multiplier (head_dim ** -0.5); causal: query i sees keys
    j <= i + Tk - Tq; normalize_before: pre-LN (LN on the block input) else post-LN (LN on the
    residual sum); eps: the layer norm's; attn_dropout: the draw over the [B, H, Tq, Tk]
    probabilities; dropout: the draw over the [Tq, B, E] output before the residual; sdpa: run
    torch's scaled_dot_product_attention (its dropout draws from torch's CUDA generator)."""

    num_heads: int
    scale: float
    causal: bool
    normalize_before: bool
    eps: float
    attn_dropout: Dropout
    dropout: Dropout
    sdpa: bool = False


# The compiled ops the block calls: the block runs only where all of them have a kernel.
OPS = ("layer_norm_fwd", "qkv_bias_split", "attention_softmax_fwd", "merge_heads", "bias_dropout_residual_fwd")


def _heads(t: torch.Tensor, num_heads: int) -> torch.Tensor:
    """[T, B, E] (any strides with a unit last stride) -> contiguous [B*H, T, hd]."""
    T, B, E = t.shape
    return t.reshape(T, B * num_heads, E // num_heads).transpose(0, 1).contiguous()


def _unheads(t: torch.Tensor, num_heads: int) -> torch.Tensor:
    """[B*H, T, hd] -> [T*B, E] (a copy), the layout of the GEMM that made the heads."""
    BH, T, hd = t.shape
    return t.transpose(0, 1).reshape(T * BH // num_heads, num_heads * hd)


def _sdpa_mask(key_padding_mask: Optional[torch.Tensor], causal: bool, Tq: int, Tk: int):
    """SDPA's boolean attend-mask [B, 1, Tq, Tk] (True = attend) and is_causal flag.

    Without a padding mask, causal attention is SDPA's is_causal (Tq == Tk) or no mask at all
    (Tq == 1). With one, a key padding mask alone is broadcast over the queries (a source row has
    at least one real token); causal + padding is the causal band minus the pad keys, and a row
    left with no key at all (a pad query before every real token: left-padded targets) attends to
    its own position instead, as SDPA would give NaN there; such a row never reaches the loss.
    All of it is device work: no sync."""
    if key_padding_mask is None:
        return None, causal and Tq > 1
    B = key_padding_mask.shape[0]
    keep = ~key_padding_mask.view(B, 1, 1, Tk).to(torch.bool)
    if not causal:
        return keep, False
    mask = torch.ones(Tq, Tk, dtype=torch.bool, device=keep.device).tril(Tk - Tq) & keep
    diag = torch.eye(Tq, Tk, dtype=torch.bool, device=keep.device)
    return mask | (diag & ~mask.any(-1, keepdim=True)), False


def sdpa_supported(causal: bool, Tq: int, Tk: int) -> bool:
    """Whether _sdpa_mask expresses this attention: causal needs Tq == Tk or Tq == 1."""
    return not causal or Tq == Tk or Tq == 1


def attention_block(x, memory, key_padding_mask, ln_weight, ln_bias, wq, bq, wk, bk, wv, bv, wo, bo,
                    cfg: AttentionBlockConfig) -> torch.Tensor:
    """The attention sublayer as one autograd node.

    x: [Tq, B, E] the block input (the residual); memory: [Tk, B, Ek] for encoder-decoder attention
    (keys and values projected from it, never normalised), None for self-attention (from the
    normalised x, one [3E, E] GEMM); key_padding_mask: [B, Tk] bool (True = pad) or None;
    ln_*: [E]; wq: [E, E], wk, wv: [E, Ek], biases [E], wo: [E, E]; one dtype for all; cfg:
    AttentionBlockConfig. Returns [Tq, B, E]: post-LN LN(x + dropout(attn + bo)), pre-LN
    x + dropout(attn(LN(x)) + bo).

    The explicit attention is the compiled op `attention_block`, whose autograd node is C++
    (csrc/ops/blocks.cpp): its forward and backward never enter Python. SDPA runs AttentionBlockFunction."""
    if cfg.sdpa:
        return AttentionBlockFunction.apply(x, memory, key_padding_mask, ln_weight, ln_bias, wq, bq, wk, bk, wv, bv,
                                            wo, bo, cfg)
    a, d = cfg.attn_dropout, cfg.dropout
    return _backend.ops().attention_block(x, memory, key_padding_mask, ln_weight, ln_bias, wq, bq, wk, bk, wv, bv, wo,
                                          bo, cfg.num_heads, cfg.scale, cfg.causal, cfg.normalize_before, cfg.eps,
                                          a.p, a.seed, a.offset, d.p, d.seed, d.offset)


class AttentionBlockFunction(torch.autograd.Function):
    """The SDPA path of attention_block (same arguments): apply(x, memory, key_padding_mask, ln_weight, ln_bias,
    wq, bq, wk, bk, wv, bv, wo, bo, cfg) with cfg.sdpa set."""

    @staticmethod
    def forward(ctx, x, memory, key_padding_mask, ln_weight, ln_bias, wq, bq, wk, bk, wv, bv, wo, bo, cfg):
        ctx.cfg = cfg
        ops = _backend.ops()
        Tq, B, E = x.shape
        H = cfg.num_heads
        h, mean, rstd = block_norm.forward_start(ops, x, ln_weight, ln_bias, cfg.normalize_before, cfg.eps)
        h2 = h.view(Tq * B, E)
        if memory is None:
            qkv = torch.mm(h2, torch.cat([wq, wk, wv]).t()).view(Tq, B, 3 * E)
            q, k, v = ops.qkv_bias_split(qkv, torch.cat([bq, bk, bv]), H)
            del qkv
        else:
            Tk = memory.shape[0]
            q = _heads(torch.addmm(bq, h2, wq.t()).view(Tq, B, E), H)
            kv = torch.addmm(torch.cat([bk, bv]), memory.reshape(Tk * B, -1), torch.cat([wk, wv]).t())
            kv = kv.view(Tk, B, 2 * E)
            k, v = _heads(kv[..., :E], H), _heads(kv[..., E:], H)
            del kv
        ctx.sdpa = _sdpa_forward(q, k, v, key_padding_mask, cfg, B)
        del q, k, v
        merged = _merge_sdpa(ctx.sdpa[0], Tq, B, E)
        out = torch.mm(merged.view(Tq * B, E), wo.t()).view(Tq, B, E)
        out_y, s, mean, rstd = block_norm.forward_end(ops, out, bo, x, cfg.dropout, ln_weight, ln_bias, mean,
                                                      rstd, cfg.normalize_before, cfg.eps)
        ctx.save_for_backward(x, memory, ln_weight, ln_bias, wq, wk, wv, wo, s, mean, rstd)
        return out_y

    @staticmethod
    def backward(ctx, dy):
        cfg = ctx.cfg
        ops = _backend.ops()
        x, memory, ln_weight, ln_bias, wq, wk, wv, wo, s, mean, rstd = ctx.saved_tensors
        Tq, B, E = x.shape
        H = cfg.num_heads
        ds, h, dln_w, dln_b = block_norm.backward_start(ops, dy, x, s, ln_weight, ln_bias, mean, rstd,
                                                        cfg.normalize_before, cfg.eps)
        dout, dbo = ops.bias_dropout_residual_bwd(ds, *cfg.dropout)
        dout2 = dout.view(Tq * B, E)
        dmerged = torch.mm(dout2, wo)  # [Tq*B, E]
        o, qs, ks, vs = ctx.sdpa
        # [Tq, B, H, hd] as SDPA's [B, H, Tq, hd]. retain_graph: a second backward through the outer graph
        # (retain_graph there) needs it again; it is freed with this node.
        dctx = dmerged.view(Tq, B, H, E // H).permute(1, 2, 0, 3).reshape(o.shape)
        dq, dk, dv = torch.autograd.grad(o, (qs, ks, vs), dctx, retain_graph=True)
        merged = _merge_sdpa(o, Tq, B, E)  # rebuilt, not saved
        dq, dk, dv = (t.reshape(B * H, -1, E // H) for t in (dq, dk, dv))
        dwo = torch.mm(dout2.t(), merged.view(Tq * B, E))
        del merged
        h2 = h.view(Tq * B, E)
        if memory is None:
            dqkv, dbqkv = ops.qkv_bias_split_bwd(dq, dk, dv, H)
            dqkv = dqkv.view(Tq * B, 3 * E)
            dwqkv = torch.mm(dqkv.t(), h2)
            dh = torch.mm(dqkv, torch.cat([wq, wk, wv]))
            dwq, dwk, dwv = dwqkv.split(E)
            dbq, dbk, dbv = dbqkv.split(E)
            dmemory = None
        else:
            Tk = memory.shape[0]
            dq2 = _unheads(dq, H)
            dwq, dbq = torch.mm(dq2.t(), h2), dq2.sum(0)
            dh = torch.mm(dq2, wq)
            dkv = torch.cat([_unheads(dk, H), _unheads(dv, H)], dim=1)  # [Tk*B, 2E]
            m2 = memory.reshape(Tk * B, -1)
            dwk, dwv = torch.mm(dkv.t(), m2).split(E)
            dbk, dbv = dkv.sum(0).split(E)
            dmemory = torch.mm(dkv, torch.cat([wk, wv])).view(memory.shape)
        dh = dh.view(Tq, B, E)
        dx, dln_w, dln_b = block_norm.backward_end(ops, ds, dh, x, ln_weight, mean, rstd, cfg.normalize_before,
                                                   dln_w, dln_b)
        return dx, dmemory, None, dln_w, dln_b, dwq, dbq, dwk, dbk, dwv, dbv, dwo, dbo, None


def _sdpa_forward(q, k, v, key_padding_mask, cfg: AttentionBlockConfig, B: int):
    """torch SDPA over [B, H, T, hd] views of q, k, v, recorded as a small graph of its own (the
    inputs detached) so that backward asks torch.autograd.grad for SDPA's own backward.
    Returns (output [B, H, Tq, hd], q, k, v leaves)."""
    BH, Tq, hd = q.shape
    Tk = k.shape[1]
    H = BH // B
    mask, is_causal = _sdpa_mask(key_padding_mask, cfg.causal, Tq, Tk)
    with torch.enable_grad():
        qs, ks, vs = (t.detach().view(B, H, -1, hd).requires_grad_() for t in (q, k, v))
        o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, dropout_p=cfg.attn_dropout.p,
                                           is_causal=is_causal, scale=cfg.scale)
    return o, qs, ks, vs


def _merge_sdpa(o: torch.Tensor, Tq: int, B: int, E: int) -> torch.Tensor:
    """SDPA output [B, H, Tq, hd] -> contiguous [Tq, B, E] (detached: the block's own node records it)."""
    return o.detach().permute(2, 0, 1, 3).reshape(Tq, B, E)
