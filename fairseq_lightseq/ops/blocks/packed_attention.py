"""The attention sublayer over packed rows (--ls-packed) as ONE autograd node: [layer norm] -> q/k/v GEMMs
-> varlen attention (per sentence, scale + causal rule + softmax + dropout) -> output GEMM -> bias + dropout
+ residual -> [layer norm].

The packed twin of attention.attention_block, for the reason given there (host time per autograd node and
per Python tensor call): one compiled op `varlen_attention_block` with a C++ autograd node
(csrc/ops/blocks.cpp) whose forward and backward call the GEMMs, ops.varlen_attention's kernels and the
fused token-wise ops from C++.

Saved for backward: the block input (and the memory of encoder-decoder attention), the layer norm's
statistics (post-LN: its input too). Without `recompute` also q, k, v, the attention's output and its
log-sum-exp ([N, H]); with `recompute` (--ls-recompute-attention) backward projects q, k, v again and reruns
the attention's forward (the same dropout mask: it is a function of its coordinates), so nothing of the
attention is kept. Nothing [B, H, Tq, Tk]-sized exists in either direction.
"""
from typing import Optional

import torch

from .. import _backend
from ..dropout_stream import flat_draw
from ..reference.varlen_attention import VarlenCoords
from .attention import AttentionBlockConfig

# The compiled ops the block calls: it runs only where all of them have a kernel.
OPS = ("layer_norm_fwd", "varlen_attention_fwd", "bias_dropout_residual_fwd")


def packed_attention_block(x, memory, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int,
                           coords: Optional[VarlenCoords], ln_weight, ln_bias, wq, bq, wk, bk, wv, bv, wo, bo,
                           cfg: AttentionBlockConfig) -> torch.Tensor:
    """The attention sublayer over packed rows as one autograd node.

    x: [Nq, E] the block input (packed query rows, the residual); memory: [Nk, Ek] packed rows for
    encoder-decoder attention (never normalised), None for self-attention; cu_seqlens_q/_k: int32 [B+1] and
    max_seqlen_q/_k as ops.varlen_attention takes them (the same for self-attention); coords: where each
    sentence sits in the padded [B, H, Tq, Tk] problem whose attention-dropout mask is drawn (None: right
    padding to the max lengths); ln_*: [E]; wq: [E, E], wk, wv: [E, Ek], biases [E], wo: [E, E]; one dtype.
    cfg: AttentionBlockConfig with sdpa False; its `dropout` may carry the packed rows' row map
    (dropout_stream.at_rows), its `attn_dropout` may not. Returns [Nq, E]: post-LN LN(x + dropout(attn + bo)),
    pre-LN x + dropout(attn(LN(x)) + bo)."""
    if cfg.sdpa:
        raise ValueError("packed_attention_block: runs ops.varlen_attention's kernels, not SDPA (cfg.sdpa must be False)")
    a = flat_draw(cfg.attn_dropout, "packed_attention_block")
    padded_q, padded_k, starts = (0, 0, None) if coords is None else coords
    return _backend.ops().varlen_attention_block(
        x, memory, cu_seqlens_q, cu_seqlens_k, starts, cfg.dropout.rows, ln_weight, ln_bias, wq, bq, wk, bk, wv, bv,
        wo, bo, cfg.num_heads, int(max_seqlen_q), int(max_seqlen_k), int(padded_q), int(padded_k), cfg.scale,
        cfg.causal, cfg.normalize_before, cfg.eps, *a, cfg.dropout.p, cfg.dropout.seed, cfg.dropout.offset,
        cfg.recompute)
