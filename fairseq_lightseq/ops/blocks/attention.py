"""A whole attention sublayer as ONE autograd node: [layer norm] -> q/k/v GEMMs -> bias + head split
-> attention (scale + masks + softmax + dropout, or torch SDPA) -> head merge -> output GEMM
-> bias + dropout + residual -> [layer norm].

Why one node rather than the per-op Functions of ops/attention.py, ops/dropout.py, ops/layer_norm.py:
on a GPU every autograd node, Python frame and dispatcher hop costs host time whatever the kernel's
size, and a layer built from per-op Functions and `F.linear` records ~20 nodes (plus views, casts
and their backward nodes). Here the block is one compiled op with a C++ autograd node
(csrc/ops/blocks.cpp): `attention_block` (explicit attention; its forward and backward are the ops
`attention_block_fwd`/`_bwd`) or `attention_block_sdpa` (torch SDPA, CUDA's path), the GEMMs, views and
fused ops called from C++ (cheaper per tensor call than from Python), and backward never
enters Python. The per-op Functions stay the reference for this composition (tests compare the two)
and serve what this path does not (autocast, devices or dtypes without kernels, incremental decoding,
attention weights).

Saved for backward: the block input, the layer norm statistics (post-LN: its input too;
pre-LN recomputes its normalised input), and, for the explicit attention, the softmax output: the
explicit path is the CPU's (and CUDA's fallback), where the softmax kernel is the costliest step of the
block and host time decides, so the softmax is not recomputed. The dropped probabilities are drawn
again from it in backward (`attention_dropout`, one pass with the forward's mask) rather than kept:
with attention dropout that halves the [B, H, Tq, Tk] bytes a layer keeps. With SDPA (CUDA's path)
nothing [B, H, Tq, Tk] is kept: SDPA saves q, k, v, its output and logsumexp, and the merged heads are
rebuilt from its output. The explicit path keeps q, k, v ([B*H, T, hd]) and the merged heads (the output
GEMM's input, [Tq*B, E]). With `AttentionBlockConfig.recompute` (--ls-recompute-attention, translation's
default) neither path keeps q, k, v: backward projects them again from the block input (one GEMM per
attention for 3 [B*H, T, hd] tensors), the explicit path rebuilds the merged heads from the
probabilities and v (one bmm), and SDPA without attention dropout reruns its forward. The concatenated
q/k/v weight is built in forward and again in backward (a [3E, E] copy) rather than saved, so it always
matches the current parameters.
"""
from typing import NamedTuple, Optional

import torch
import torch._guards

from .. import _backend
from ..dropout_stream import Dropout, flat_draw


def _causal_lower_right():
    """torch's causal_lower_right, or None on torch < 2.2 (the caller then builds the band itself).
    Imported on first use, on CUDA only: the module imports torch._dynamo (about 2 s), which every
    fairseq process started with --user-dir would otherwise pay at import."""
    try:
        from torch.nn.attention.bias import causal_lower_right
    except ImportError:
        return None
    return causal_lower_right


class AttentionBlockConfig(NamedTuple):
    """The non-tensor arguments of one attention block.

    num_heads: H; scale: the q.k multiplier (head_dim ** -0.5); causal: query i sees keys
    j <= i + Tk - Tq; normalize_before: pre-LN (LN on the block input) else post-LN (LN on the
    residual sum); eps: the layer norm's; attn_dropout: the draw over the [B, H, Tq, Tk]
    probabilities; dropout: the draw over the [Tq, B, E] output before the residual (both over the
    flat index: a draw with rows is a ValueError); sdpa: run
    torch's scaled_dot_product_attention (its dropout draws from torch's CUDA generator); recompute:
    backward projects q, k, v again from the block input (and reruns SDPA's forward without attention
    dropout, or rebuilds the merged heads on the explicit path) instead of keeping them: less memory
    for one more QKV GEMM per step (the models' --ls-recompute-attention)."""

    num_heads: int
    scale: float
    causal: bool
    normalize_before: bool
    eps: float
    attn_dropout: Dropout
    dropout: Dropout
    sdpa: bool = False
    recompute: bool = False


# The compiled ops the block calls: the block runs only where all of them have a kernel.
OPS = ("layer_norm_fwd", "qkv_bias_split", "attention_softmax_fwd", "attention_dropout", "merge_heads",
       "bias_dropout_residual_fwd")


def split_heads(t: torch.Tensor, num_heads: int) -> torch.Tensor:
    """[T, B, E] (any strides with a unit last stride) -> contiguous [B*H, T, hd]."""
    T, B, E = t.shape
    return t.reshape(T, B * num_heads, E // num_heads).transpose(0, 1).contiguous()


def sdpa_key_padding_mask(key_padding_mask: Optional[torch.Tensor], causal: bool,
                          right_padded: bool) -> Optional[torch.Tensor]:
    """The key padding mask torch SDPA needs: None for causal attention over right-padded rows, else
    key_padding_mask. The one place that decides; the module, sequence-parallel and compiled-block paths
    call it (the explicit attention keeps its mask whatever this says).

    right_padded: every row of the batch is its real tokens then only padding (fairseq's language_modeling
    task, whose MonolingualDataset and LMContextWindowDataset pad on the right; translation targets unless
    --left-pad-target), so a row of length n has its pad keys at j >= n, and the attention has all its
    keys (self-attention without incremental state). Why dropping the mask is correct there:
    - a real query i < n sees keys j <= i under the causal rule, all real: the pad-key mask removes
      nothing from its row, so causal attention without it gives the same row;
    - a pad query i >= n now also attends to pad keys j in [n, i] (its output differs, finite: key 0 is
      always in its band), but nothing reaching the loss depends on it: real queries never attend to pad
      rows' keys or values (j >= n > i), the feed-forward and norms are token-wise, and the criterion
      ignores pad targets; so the loss, and every gradient (a pad row's gradient is exactly zero, in
      either version), are the masked version's.
    What it saves: SDPA then runs with its causal flag (or the lower-right band for a sequence-parallel
    allgather rank's queries; sdpa_mask) instead of keeping a [B, 1, Tq, Tk] mask per layer for backward.
    Left-padded or unknown rows keep the mask: there a real query does reach pad keys."""
    if causal and right_padded:
        return None
    return key_padding_mask


def sdpa_mask(key_padding_mask: Optional[torch.Tensor], causal: bool, Tq: int, Tk: int,
               device: Optional[torch.device] = None):
    """SDPA's attn_mask (boolean [B, 1, Tq, Tk], True = attend, or torch's CausalBias) and is_causal flag.

    Without a padding mask, causal attention is SDPA's is_causal (Tq == Tk), no mask at all (Tq == 1), or
    for Tq < Tk (an allgather rank's queries over the causal key prefix) the lower-right band (query i
    sees keys j <= i + Tk - Tq; _lower_right_band: no mask tensor on CUDA, one [Tq, Tk] band without the
    batch dim elsewhere). With a padding mask, a key padding mask alone is broadcast over the queries
    (a source row has at least one real token); causal + padding is the causal band minus the pad keys,
    and a row left with no key at all (a pad query before every real token: left-padded targets) attends to
    its own position instead, as SDPA would give NaN there; such a row never reaches the loss.
    All of it is device work: no sync. Causal without a padding mask needs Tq <= Tk (sdpa_supported)."""
    if key_padding_mask is None:
        if causal and 1 < Tq < Tk:
            return _lower_right_band(Tq, Tk, device), False
        return None, causal and Tq > 1
    B = key_padding_mask.shape[0]
    keep = ~key_padding_mask.view(B, 1, 1, Tk).to(torch.bool)
    if not causal:
        return keep, False
    mask = torch.ones(Tq, Tk, dtype=torch.bool, device=keep.device).tril(Tk - Tq) & keep
    diag = torch.eye(Tq, Tk, dtype=torch.bool, device=keep.device)
    return mask | (diag & ~mask.any(-1, keepdim=True)), False


def _lower_right_band(Tq: int, Tk: int, device: Optional[torch.device]):
    """SDPA's attn_mask for causal attention with Tq < Tk, lower-right aligned. On CUDA torch's
    `causal_lower_right(Tq, Tk)`, which SDPA's flash and memory-efficient kernels take as a flag (no mask
    tensor, none kept for backward; where neither kernel applies torch materialises it). Elsewhere, and
    under FakeTensorMode (the bench's fake cells, tracing: the CausalBias subclass cannot be made there),
    the boolean [Tq, Tk] band: the CPU's SDPA would materialise CausalBias as exactly that."""
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type == "cuda" and torch._guards.detect_fake_mode() is None:
        causal_lower_right = _causal_lower_right()
        if causal_lower_right is not None:
            return causal_lower_right(Tq, Tk)
    return torch.ones(Tq, Tk, dtype=torch.bool, device=dev).tril(Tk - Tq)


def sdpa_supported(causal: bool, Tq: int, Tk: int, compiled: bool = False) -> bool:
    """Whether SDPA's masks express this attention without a padding mask: causal needs Tq <= Tk in
    sdpa_mask; the compiled block's C++ sdpa_mask (compiled=True) has no lower-right band, so there
    causal needs Tq == Tk or Tq == 1."""
    return not causal or Tq == Tk or Tq == 1 or (Tq < Tk and not compiled)


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
    a, d = flat_draw(cfg.attn_dropout, "attention_block"), flat_draw(cfg.dropout, "attention_block")
    if cfg.sdpa:
        return _backend.ops().attention_block_sdpa(x, memory, key_padding_mask, ln_weight, ln_bias, wq, bq, wk, bk, wv,
                                                   bv, wo, bo, cfg.num_heads, cfg.scale, cfg.causal,
                                                   cfg.normalize_before, cfg.eps, a[0], *d, cfg.recompute)
    return _backend.ops().attention_block(x, memory, key_padding_mask, ln_weight, ln_bias, wq, bq, wk, bk, wv, bv, wo,
                                          bo, cfg.num_heads, cfg.scale, cfg.causal, cfg.normalize_before, cfg.eps,
                                          *a, *d, cfg.recompute)
