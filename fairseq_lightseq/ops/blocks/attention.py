"""A whole attention sublayer as ONE autograd node: [layer norm] -> q/k/v GEMMs -> bias + head split
-> attention (scale + masks + softmax + dropout, or torch SDPA) -> head merge -> output GEMM
-> bias + dropout + residual -> [layer norm].

Why one node rather than the per-op Functions of ops/attention.py, ops/dropout.py, ops/layer_norm.py:
on a GPU every autograd node, Python frame and dispatcher hop costs host time whatever the kernel's
size, and a layer built from per-op Functions and `F.linear` records ~20 nodes (plus views, casts
and their backward nodes). Here the block is one compiled op with a C++ autograd node
(csrc/ops/blocks.cpp): `attention_block` (explicit attention; its forward and backward are the ops
`attention_block_fwd`/`_bwd`) or `attention_block_sdpa` (torch SDPA, CUDA's path), the GEMMs, views and
fused ops called from C++ (about 1.5-5 us per tensor call less than from Python), and backward never
enters Python. The per-op Functions stay the reference for this composition (tests compare the two)
and serve what this path does not (autocast, devices or dtypes without kernels, incremental decoding,
attention weights).

Saved for backward: the block input, the layer norm statistics (post-LN: its input too;
pre-LN recomputes its normalised input), and, for the explicit attention, the softmax output: the
explicit path is the CPU's (and CUDA's fallback), where the softmax kernel is the costliest step of the
block and host time decides, so the softmax is not recomputed. The dropped probabilities are drawn
again from it in backward (`attention_dropout`, one pass with the forward's mask) rather than kept:
with attention dropout that halves the [B, H, Tq, Tk] bytes a layer keeps. The merged heads (the
output GEMM's input, [Tq, B, E]) are recomputed from the probabilities and v (one bmm and one copy). With SDPA (CUDA's path) nothing [B, H, Tq, Tk] is kept: SDPA saves its output and
logsumexp, and the merged heads are rebuilt from its output. The explicit path does not keep q, k, v
either: its backward projects them again from the block input (one GEMM per attention for 3 [B*H, T, hd]
tensors, about a fifth of a layer's saved bytes); SDPA's own node keeps them on that path. The
concatenated q/k/v weight is built in forward and again in backward (a [3E, E] copy) rather than saved,
so it always matches the current parameters.
"""
from typing import NamedTuple, Optional

import torch

from .. import _backend
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
OPS = ("layer_norm_fwd", "qkv_bias_split", "attention_softmax_fwd", "attention_dropout", "merge_heads",
       "bias_dropout_residual_fwd")


def _heads(t: torch.Tensor, num_heads: int) -> torch.Tensor:
    """[T, B, E] (any strides with a unit last stride) -> contiguous [B*H, T, hd]."""
    T, B, E = t.shape
    return t.reshape(T, B * num_heads, E // num_heads).transpose(0, 1).contiguous()


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

    The compiled op `attention_block` (explicit attention) or `attention_block_sdpa` (torch SDPA), whose
    autograd node is C++ (csrc/ops/blocks.cpp): forward and backward never enter Python."""
    a, d = cfg.attn_dropout, cfg.dropout
    if cfg.sdpa:
        return _backend.ops().attention_block_sdpa(x, memory, key_padding_mask, ln_weight, ln_bias, wq, bq, wk, bk, wv,
                                                   bv, wo, bo, cfg.num_heads, cfg.scale, cfg.causal,
                                                   cfg.normalize_before, cfg.eps, a.p, d.p, d.seed, d.offset)
    return _backend.ops().attention_block(x, memory, key_padding_mask, ln_weight, ln_bias, wq, bq, wk, bk, wv, bv, wo,
                                          bo, cfg.num_heads, cfg.scale, cfg.causal, cfg.normalize_before, cfg.eps,
                                          a.p, a.seed, a.offset, d.p, d.seed, d.offset)
