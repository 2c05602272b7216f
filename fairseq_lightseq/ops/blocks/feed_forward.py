"""A whole feed-forward sublayer as ONE autograd node: [layer norm] -> fc1 GEMM -> bias + activation
+ dropout -> fc2 GEMM -> bias + dropout + residual -> [layer norm].

One C++ autograd node (op `ffn_block`) whose forward and backward are one compiled function each
(`ffn_block_fwd`/`ffn_block_bwd`, csrc/ops/blocks.cpp: the GEMMs and the fused ops called from C++), for the reason
given in ops/blocks/attention.py (host time per autograd node and per Python tensor call). Saved for backward: the block input, the fc1 output (the
activation's input) and the layer norm statistics (post-LN: its input too). The activation output
(the fc2 input, 4x the hidden size at the usual FFN width) is recomputed in backward by one
memory-bound kernel instead of being stored, and a pre-LN block recomputes its normalised input.
"""
from typing import NamedTuple, Optional

import torch

from .. import _backend
from ..dropout_stream import Dropout


class FeedForwardBlockConfig(NamedTuple):
    """act: relu | gelu | gelu_tanh; act_dropout: the draw over the [..., F] activations;
    dropout: the draw over the [..., E] output before the residual (both over the flat index, or both
    with the same row map over packed rows: dropout_stream.at_rows); normalize_before: pre-LN else
    post-LN; eps: the layer norm's."""

    act: str
    act_dropout: Dropout
    dropout: Dropout
    normalize_before: bool
    eps: float


OPS = ("layer_norm_fwd", "bias_act_dropout_fwd", "bias_dropout_residual_fwd")


def feed_forward_block(x, ln_weight, ln_bias, w1, b1, w2, b2, cfg: FeedForwardBlockConfig) -> torch.Tensor:
    """x: [T, B, E], or packed rows [N, E] whose draws carry their row map; ln_*: [E]; w1: [F, E]; b1: [F];
    w2: [E, F]; b2: [E]; one dtype; cfg: FeedForwardBlockConfig. Returns x's shape: post-LN
    LN(x + dropout(fc2(act_dropout(fc1(x))))), pre-LN x + dropout(fc2(...(LN(x)))). One compiled op whose
    autograd node is C++ (csrc/ops/blocks.cpp)."""
    a, d = cfg.act_dropout, cfg.dropout
    return _backend.ops().ffn_block(x, ln_weight, ln_bias, w1, b1, w2, b2, cfg.act, cfg.normalize_before, cfg.eps,
                                    a.p, a.seed, a.offset, d.p, d.seed, d.offset, _row_map(a, d))


def _row_map(*draws: Dropout) -> Optional[torch.Tensor]:
    """The one row map of the block's draws (None without one); a ValueError when two draws carry
    different maps (the block reads both dropouts' rows through one)."""
    maps = [d.rows for d in draws if d.rows is not None]
    if any(m is not maps[0] for m in maps[1:]):
        raise ValueError("feed_forward_block: the two dropout draws carry different row maps")
    return maps[0] if maps else None
