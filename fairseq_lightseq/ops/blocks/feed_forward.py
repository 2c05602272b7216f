"""A whole feed-forward sublayer as ONE autograd node: [layer norm] -> fc1 GEMM -> bias + activation
+ dropout -> fc2 GEMM -> bias + dropout + residual -> [layer norm].

One node, forward and backward each in one Python frame calling the GEMMs and
`torch.ops.fairseq_lightseq.*` directly, for the reason given in ops/blocks/attention.py (host time
per autograd node and Python call). Saved for backward: the block input, the fc1 output (the
activation's input) and the layer norm statistics (post-LN: its input too). The activation output
(the fc2 input, 4x the hidden size at the usual FFN width) is recomputed in backward by one
memory-bound kernel instead of being stored, and a pre-LN block recomputes its normalised input.
"""
from typing import NamedTuple

import torch

from .. import _backend
from . import norm as block_norm
from .._backend import Dropout


class FeedForwardBlockConfig(NamedTuple):
    """act: relu | gelu | gelu_tanh; act_dropout: the draw over the [T, B, F] activations;
    dropout: the draw over the [T, B, E] output before the residual; normalize_before: pre-LN else
    post-LN; eps: the layer norm's."""

    act: str
    act_dropout: Dropout
    dropout: Dropout
    normalize_before: bool
    eps: float


OPS = ("layer_norm_fwd", "bias_act_dropout_fwd", "bias_dropout_residual_fwd")


class FeedForwardBlockFunction(torch.autograd.Function):
    """apply(x, ln_weight, ln_bias, w1, b1, w2, b2, cfg). x: [T, B, E]; ln_*: [E]; w1: [F, E];
    b1: [F]; w2: [E, F]; b2: [E]; one dtype; cfg: FeedForwardBlockConfig. Returns [T, B, E]:
    post-LN LN(x + dropout(fc2(act_dropout(fc1(x))))), pre-LN x + dropout(fc2(...(LN(x))))."""

    @staticmethod
    def forward(ctx, x, ln_weight, ln_bias, w1, b1, w2, b2, cfg):
        ops = _backend.ops()
        T, B, E = x.shape
        h, mean, rstd = block_norm.forward_start(ops, x, ln_weight, ln_bias, cfg.normalize_before, cfg.eps)
        pre = torch.mm(h.view(T * B, E), w1.t())  # [T*B, F]
        act = ops.bias_act_dropout_fwd(pre, b1, cfg.act_dropout.p, cfg.act, cfg.act_dropout.seed,
                                       cfg.act_dropout.offset)
        out = torch.mm(act, w2.t()).view(T, B, E)
        del act
        y, s, mean, rstd = block_norm.forward_end(ops, out, b2, x, cfg.dropout, ln_weight, ln_bias, mean, rstd,
                                                  cfg.normalize_before, cfg.eps)
        ctx.save_for_backward(x, ln_weight, ln_bias, w1, b1, w2, pre, s, mean, rstd)
        ctx.cfg = cfg
        return y

    @staticmethod
    def backward(ctx, dy):
        ops = _backend.ops()
        cfg = ctx.cfg
        x, ln_weight, ln_bias, w1, b1, w2, pre, s, mean, rstd = ctx.saved_tensors
        T, B, E = x.shape
        ds, h, dln_w, dln_b = block_norm.backward_start(ops, dy, x, s, ln_weight, ln_bias, mean, rstd,
                                                        cfg.normalize_before, cfg.eps)
        dout, db2 = ops.bias_dropout_residual_bwd(ds, *cfg.dropout)
        dout2 = dout.view(T * B, E)
        d = cfg.act_dropout
        act = ops.bias_act_dropout_fwd(pre, b1, d.p, cfg.act, d.seed, d.offset)  # recomputed, not saved
        dw2 = torch.mm(dout2.t(), act)
        del act
        dpre, db1 = ops.bias_act_dropout_bwd(torch.mm(dout2, w2), pre, b1, d.p, cfg.act, d.seed, d.offset)
        h2 = h.view(T * B, E)
        dw1 = torch.mm(dpre.t(), h2)
        dh = torch.mm(dpre, w1).view(T, B, E)
        del dpre
        dx, dln_w, dln_b = block_norm.backward_end(ops, ds, dh, x, ln_weight, mean, rstd, cfg.normalize_before,
                                                   dln_w, dln_b)
        return dx, dln_w, dln_b, dw1, db1, dw2, db2, None
