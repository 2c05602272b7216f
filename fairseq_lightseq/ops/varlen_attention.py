"""Differentiable attention over packed rows over torch.ops.fairseq_lightseq.varlen_attention_{fwd,bwd}.

The forward returns the output and the log-sum-exp of each query's scores; backward recomputes the
probabilities from q, k and the log-sum-exp and regenerates the dropout mask, so nothing [N, N]-sized is
kept. The packing metadata (cu_seqlens, max lengths, VarlenCoords) is made once per batch where the
lengths are known (on the host) and handed to every layer: the op itself never reads it back from a GPU.

On CUDA, packed attention runs torch's flash varlen kernel wherever it applies (modules.multihead_attention's
use_flash); these kernels serve where it does not (fp32, other head dims) and `--ls-attention explicit`, the path
that reproduces the padded run's attention-dropout masks (the note at the top of csrc/cuda/varlen_attention.cu).
"""
__all__ = ["VarlenCoords", "varlen_attention"]

from typing import Optional, Union

import torch

from . import _backend, reference
from .dropout_stream import Dropout, as_dropout, flat_draw
from .reference.varlen_attention import VarlenCoords


class VarlenAttentionFunction(torch.autograd.Function):
    """apply(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale, p, seed, offset,
    starts, padded_q, padded_k): the op's arguments (starts None and padded_* 0 for the default coordinates)."""

    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, p, seed, offset, starts, padded_q, padded_k):
        out, lse = _backend.ops().varlen_attention_fwd(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, p, seed,
                                                       offset, starts, padded_q, padded_k)
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, starts)
        ctx.args = (max_q, max_k, causal, scale, p, seed, offset)
        ctx.padded = (padded_q, padded_k)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, cu_q, cu_k, starts = ctx.saved_tensors
        dq, dk, dv = _backend.ops().varlen_attention_bwd(dout, q, k, v, out, lse, cu_q, cu_k, *ctx.args, starts,
                                                         *ctx.padded)
        return (dq, dk, dv) + (None,) * 12


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                     cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, causal: bool = False,
                     scale: Optional[float] = None, p: Union[float, Dropout] = 0.0, training: bool = True,
                     coords: Optional[VarlenCoords] = None) -> torch.Tensor:
    """Attention over packed sentences: encoder self-attention, causal decoder self-attention, cross-attention.

    q: [Nq, H, D]; k, v: [Nk, H, D]; fp32/fp64/bf16 (CPU) or fp32/fp16/bf16 (CUDA), one dtype. Sentence b
    owns query rows cu_seqlens_q[b]:cu_seqlens_q[b+1] and key rows cu_seqlens_k[b]:cu_seqlens_k[b+1]
    (cu_seqlens_*: [B+1] int32 on q's device, 0 first, the row count last); max_seqlen_*: ints >= every
    length (they size the CUDA grid; no device read). causal: query i of a sentence sees keys
    j <= i + Lk - Lq (decoder self-attention, Lq == Lk: j <= i); else all its keys. scale: the q.k
    multiplier (default D ** -0.5). p: the attention-dropout draw (a Dropout over the padded problem's
    flat [B, H, Tq, Tk] index, as attention_softmax_dropout's, without rows: ValueError), or a float (a
    fresh seed, offset 0); coords: VarlenCoords placing each sentence in that padded problem (default: right padding to
    max_seqlen_q / _k), so that packed and padded runs draw the same masks. Returns [Nq, H, D], q's dtype;
    a query that sees no key gives zeros. Never builds a [N, N] mask or a padded [B, T, T] tensor."""
    d = flat_draw(as_dropout(p, training), "varlen_attention")
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    if _backend.use_kernel("varlen_attention_fwd", q.device.type, q.dtype):
        padded_q, padded_k, starts = (0, 0, None) if coords is None else coords
        return _backend.apply(VarlenAttentionFunction, q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q),
                              int(max_seqlen_k), causal, scale, *d, starts, int(padded_q), int(padded_k))
    return reference.varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale,
                                      *d, coords)


@_backend.register_fake("varlen_attention_fwd")
def _varlen_attention_fwd_fake(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, p, seed, offset, starts=None,
                               padded_q=0, padded_k=0):
    lse = q.new_empty(q.shape[:2], dtype=torch.float64 if q.dtype == torch.float64 else torch.float32)
    return torch.empty_like(q), lse


@_backend.register_fake("varlen_attention_bwd")
def _varlen_attention_bwd_fake(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal, scale, p, seed, offset,
                               starts=None, padded_q=0, padded_k=0):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
