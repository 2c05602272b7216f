"""The attention sublayer over packed rows as ONE autograd node on torch's flash varlen kernel: [layer norm] ->
q/k/v GEMMs -> flash attention (ops.flash_attention) -> output GEMM -> bias + dropout + residual -> [layer norm].

The flash twin of packed_attention.packed_attention_block (same arguments, same arithmetic around the
attention, same saved tensors), written in Python beside it: torch's flash ops are called by the schema
checked at import (ops.flash_attention), which the compiled block, built against one torch, could not follow.
One node per sublayer as there; the Python frames it adds per step are the forward's and the backward's.

Saved for backward: the block input (and the memory of encoder-decoder attention), the layer norm's
statistics (post-LN: its input too), and q, k, v, the attention's output, log-sum-exp and rng state. With
`recompute` (--ls-recompute-attention) none of the attention's: backward projects q, k, v again and reruns the
flash forward with the CUDA generator set back to its state before the forward (the same dropout mask).
The attention-dropout mask is torch's (its CUDA generator); the residual dropout keeps the row map of the
padded run's Philox mask.
"""
import torch

from .. import _backend
from ..flash_attention import FlashResult, flash_backward, flash_forward, generator_state, replay
from .attention import AttentionBlockConfig


def _project(h, memory, wq, bq, wk, bk, wv, bv, num_heads: int):
    """q [Nq, H, hd] from the normalised rows h [Nq, E]; k, v [Nk, H, hd] from memory [Nk, Ek] (encoder-decoder
    attention) or h (self-attention). One GEMM each, so each is contiguous as the flash kernel takes it."""
    src = h if memory is None else memory
    E = wq.shape[0]
    return (torch.addmm(bq, h, wq.t()).view(h.shape[0], num_heads, E // num_heads),
            torch.addmm(bk, src, wk.t()).view(src.shape[0], num_heads, E // num_heads),
            torch.addmm(bv, src, wv.t()).view(src.shape[0], num_heads, E // num_heads))


class FlashPackedAttentionBlockFunction(torch.autograd.Function):
    """apply(x, memory, cu_q, cu_k, rows, ln_weight, ln_bias, wq, bq, wk, bk, wv, bv, wo, bo, max_q, max_k, cfg):
    flash_packed_attention_block's arguments (rows: the residual dropout's row map, or None)."""

    @staticmethod
    def forward(ctx, x, memory, cu_q, cu_k, rows, ln_weight, ln_bias, wq, bq, wk, bk, wv, bv, wo, bo, max_q, max_k,
                cfg: AttentionBlockConfig):
        ops, d, p = _backend.ops(), cfg.dropout, cfg.attn_dropout.p
        mean = rstd = s = None
        h = x
        if cfg.normalize_before:
            h, mean, rstd = ops.layer_norm_fwd(x, ln_weight, ln_bias, cfg.eps)
        q, k, v = _project(h, memory, wq, bq, wk, bk, wv, bv, cfg.num_heads)
        state = generator_state(x.device, p) if cfg.recompute else None
        res = flash_forward(q, k, v, cu_q, cu_k, max_q, max_k, p, cfg.causal, cfg.scale)
        o = torch.mm(res.out.view(x.shape), wo.t())
        y = ops.bias_dropout_residual_fwd(o, bo, x, d.p, d.seed, d.offset, rows)
        if not cfg.normalize_before:
            s = y
            y, mean, rstd = ops.layer_norm_fwd(s, ln_weight, ln_bias, cfg.eps)
        kept = () if cfg.recompute else (q, k, v, *res)
        ctx.save_for_backward(x, memory, cu_q, cu_k, rows, ln_weight, ln_bias, wq, bq, wk, bk, wv, bv, wo, s, mean,
                              rstd, *kept)
        ctx.args = (max_q, max_k, cfg, state)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, memory, cu_q, cu_k, rows, ln_weight, ln_bias, wq, bq, wk, bk, wv, bv, wo, s, mean, rstd, *kept = \
            ctx.saved_tensors
        max_q, max_k, cfg, state = ctx.args
        ops, d, p = _backend.ops(), cfg.dropout, cfg.attn_dropout.p
        dy = dy.contiguous()
        dln_w = dln_b = None
        if cfg.normalize_before:
            ds, h = dy, ops.layer_norm_fwd(x, ln_weight, ln_bias, cfg.eps)[0]
        else:
            (ds, dln_w, dln_b), h = ops.layer_norm_bwd(dy, s, ln_weight, mean, rstd), x
        if kept:
            q, k, v, *res = kept
            res = FlashResult(*res)
        else:
            q, k, v = _project(h, memory, wq, bq, wk, bk, wv, bv, cfg.num_heads)
            with replay(x.device, state):
                res = flash_forward(q, k, v, cu_q, cu_k, max_q, max_k, p, cfg.causal, cfg.scale)
        dout, dbo = ops.bias_dropout_residual_bwd(ds, d.p, d.seed, d.offset, rows)
        E = x.shape[1]
        dwo = torch.mm(dout.t(), res.out.view(x.shape))
        dq, dk, dv = flash_backward(torch.mm(dout, wo).view(q.shape), q, k, v, cu_q, cu_k, max_q, max_k, p,
                                    cfg.causal, cfg.scale, res)
        dq2, dk2, dv2 = dq.view(-1, E), dk.view(-1, E), dv.view(-1, E)
        src = h if memory is None else memory
        dh = torch.mm(dq2, wq)
        dmemory = None
        if memory is None:
            dh.addmm_(dk2, wk).addmm_(dv2, wv)
        else:
            dmemory = torch.mm(dk2, wk).addmm_(dv2, wv)
        if cfg.normalize_before:
            dhx, dln_w, dln_b = ops.layer_norm_bwd(dh, x, ln_weight, mean, rstd)
            dx = ds + dhx
        else:
            dx = ds + dh
        return (dx, dmemory, None, None, None, dln_w, dln_b, torch.mm(dq2.t(), h), dq2.sum(0), torch.mm(dk2.t(), src),
                dk2.sum(0), torch.mm(dv2.t(), src), dv2.sum(0), dwo, dbo, None, None, None)


def flash_packed_attention_block(x, memory, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int,
                                 ln_weight, ln_bias, wq, bq, wk, bk, wv, bv, wo, bo,
                                 cfg: AttentionBlockConfig) -> torch.Tensor:
    """The attention sublayer over packed rows as one autograd node, its attention on torch's flash varlen kernel.

    x: [Nq, E] the block input (packed query rows, the residual); memory: [Nk, Ek] packed rows for encoder-decoder
    attention, None for self-attention; cu_seqlens_q/_k: int32 [B+1] on x's device; max_seqlen_q/_k: host ints;
    ln_*: [E]; wq: [E, E], wk, wv: [E, Ek], biases [E], wo: [E, E]; one dtype, fp16/bf16 CUDA (where
    ops.flash_attention.flash_problem is None). cfg: as packed_attention_block's; only attn_dropout.p is read
    of the attention's draw (the mask is torch's), the residual dropout may carry the packed rows' row map.
    Returns [Nq, E]: post-LN LN(x + dropout(attn + bo)), pre-LN x + dropout(attn(LN(x)) + bo)."""
    return _backend.apply(FlashPackedAttentionBlockFunction, x, memory, cu_seqlens_q, cu_seqlens_k, cfg.dropout.rows,
                          ln_weight, ln_bias, wq, bq, wk, bk, wv, bv, wo, bo, int(max_seqlen_q), int(max_seqlen_k),
                          cfg)
