"""Differentiable attention probabilities (scale + masks + softmax + dropout) and head split/merge,
over torch.ops.fairseq_lightseq.{attention_softmax,qkv_bias_split,merge_heads}{,_bwd}.

attention_softmax_fwd returns (y, out): y = softmax(scale * scores + masks) in scores' dtype, saved
for backward; out = the dropped probabilities, or an empty tensor when dropout is off
(floor(p * 2^24) == 0), in which case y itself is the result. Backward regenerates the dropout mask
from (seed, offset) instead of storing it. attention_dropout draws the dropped probabilities again from y
(the same mask), so that attention_softmax_dropout_bmm, whose backward needs them for dv, keeps only y and v.
"""
__all__ = ["attention_softmax_dropout", "attention_softmax_dropout_bmm", "attention_dropout", "qkv_bias_split",
           "merge_heads"]

from typing import Optional, Union

import torch

from . import _backend, reference
from .dropout_stream import Dropout, as_dropout, flat_draw
from .reference.attention import CoordsArg, attention_coords
from .reference.philox import dropout_threshold


class AttentionSoftmaxDropoutFunction(torch.autograd.Function):
    """apply(scores, key_padding_mask, causal, scale, p, seed, offset=0, coords=()): explicit seed, so
    tests (gradcheck with dropout) see one fixed mask; coords: [] or the 6 ints of an AttentionCoords."""

    @staticmethod
    def forward(ctx, scores, key_padding_mask, causal, scale, p, seed, offset=0, coords=()):
        coords = list(coords)
        y, out = _backend.ops().attention_softmax_fwd(scores, key_padding_mask, causal, scale, p, seed, offset,
                                                      coords)
        ctx.save_for_backward(y)
        ctx.args = (scale, p, seed, offset, coords)
        return y if dropout_threshold(p) == 0 else out

    @staticmethod
    def backward(ctx, dout):
        (y,) = ctx.saved_tensors
        dscores = _backend.ops().attention_softmax_bwd(dout, y, *ctx.args)
        return dscores, None, None, None, None, None, None, None


def attention_softmax_dropout(scores: torch.Tensor, key_padding_mask: Optional[torch.Tensor] = None,
                              causal: bool = False, scale: float = 1.0, p: Union[float, Dropout] = 0.0,
                              training: bool = True, coords: CoordsArg = None) -> torch.Tensor:
    """dropout(softmax(scale * scores + masks)). scores: [B, H, Tq, Tk] fp32/fp64/bf16 (CPU) or
    fp32/fp16/bf16 (CUDA); key_padding_mask: [B, Tk] bool (True = pad) or None; causal: query i sees
    keys j <= i + Tk - Tq (local indices); p: a Dropout draw over the flat [B, H, Tq, Tk] index, or a
    float (a fresh seed, offset 0), without rows (ValueError); coords: None, or an AttentionCoords
    (H_tot, h_off, Tq_tot, q_off, Tk_tot, k_off) placing scores in a global [B, H_tot, Tq_tot, Tk_tot]
    whose flat index the dropout draws instead (a slice of heads, queries or keys then draws the full
    call's mask). All-masked rows give zeros. Returns [B, H, Tq, Tk], scores' dtype."""
    d = flat_draw(as_dropout(p, training), "attention_softmax_dropout")
    c = [] if coords is None or len(coords) == 0 else list(attention_coords(coords, scores.shape))
    if _backend.use_kernel("attention_softmax_fwd", scores.device.type, scores.dtype):
        return _backend.apply(AttentionSoftmaxDropoutFunction, scores, key_padding_mask, causal, scale, *d, c)
    return reference.attention_softmax_dropout(scores, key_padding_mask, causal, scale, *d, c)


class AttentionSoftmaxDropoutBmmFunction(torch.autograd.Function):
    """apply(scores, v, key_padding_mask, causal, scale, p, seed, offset, coords): dropout(softmax(...)) @ v.
    Saves y (the softmax output) and v; the dropped probabilities, which the bmm's backward needs for dv, are
    drawn again from y rather than kept: one [B, H, Tq, Tk] tensor saved instead of two."""

    @staticmethod
    def forward(ctx, scores, v, key_padding_mask, causal, scale, p, seed, offset=0, coords=()):
        coords = list(coords)
        y, out = _backend.ops().attention_softmax_fwd(scores, key_padding_mask, causal, scale, p, seed, offset,
                                                      coords)
        ctx.save_for_backward(y, v)
        ctx.args = (scale, p, seed, offset, coords)
        return torch.matmul(y if dropout_threshold(p) == 0 else out, v)

    @staticmethod
    def backward(ctx, dctx):
        y, v = ctx.saved_tensors
        scale, p, seed, offset, coords = ctx.args
        probs = y if dropout_threshold(p) == 0 else _backend.ops().attention_dropout(y, p, seed, offset, coords)
        dv = torch.matmul(probs.transpose(-1, -2), dctx)
        del probs
        dscores = _backend.ops().attention_softmax_bwd(torch.matmul(dctx, v.transpose(-1, -2)), y, *ctx.args)
        return dscores, dv, None, None, None, None, None, None, None


def attention_softmax_dropout_bmm(scores: torch.Tensor, v: torch.Tensor,
                                  key_padding_mask: Optional[torch.Tensor] = None, causal: bool = False,
                                  scale: float = 1.0, p: Union[float, Dropout] = 0.0, training: bool = True,
                                  coords: CoordsArg = None) -> torch.Tensor:
    """attention_softmax_dropout(scores, ...) @ v. scores: [B, H, Tq, Tk]; v: [B, H, Tk, hd], scores' dtype;
    the other arguments as attention_softmax_dropout's. Returns [B, H, Tq, hd]. For backward it keeps the
    softmax output and v only (autograd through the separate op and bmm would keep the dropped
    probabilities too, a second [B, H, Tq, Tk] tensor)."""
    d = flat_draw(as_dropout(p, training), "attention_softmax_dropout_bmm")
    c = [] if coords is None or len(coords) == 0 else list(attention_coords(coords, scores.shape))
    if _backend.use_kernel("attention_softmax_fwd", scores.device.type, scores.dtype):
        return _backend.apply(AttentionSoftmaxDropoutBmmFunction, scores, v, key_padding_mask, causal, scale, *d, c)
    return torch.matmul(reference.attention_softmax_dropout(scores, key_padding_mask, causal, scale, *d, c), v)


def attention_dropout(y: torch.Tensor, p: float, seed: int, offset: int = 0, coords: CoordsArg = None) -> torch.Tensor:
    """The dropped probabilities attention_softmax_dropout(scores, ..., p, seed, offset, coords) returned,
    again from its softmax output y [B, H, Tq, Tk] (the same mask): y * keep / (1 - p); y itself when the
    dropout is off. Not differentiable (backward passes use it)."""
    if dropout_threshold(p) == 0:
        return y
    c = [] if coords is None or len(coords) == 0 else list(attention_coords(coords, y.shape))
    if _backend.use_kernel("attention_dropout", y.device.type, y.dtype):
        return _backend.ops().attention_dropout(y, p, seed, offset, c)
    return reference.attention_dropout(y, p, seed, offset, c)


class QkvBiasSplitFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, qkv, bias, num_heads):
        ctx.num_heads = num_heads
        return _backend.ops().qkv_bias_split(qkv, bias, num_heads)

    @staticmethod
    def backward(ctx, dq, dk, dv):
        # An output that did not reach the loss has no gradient: use zeros of its shape.
        ref = next(g for g in (dq, dk, dv) if g is not None)
        dq, dk, dv = [torch.zeros_like(ref) if g is None else g for g in (dq, dk, dv)]
        dqkv, dbias = _backend.ops().qkv_bias_split_bwd(dq, dk, dv, ctx.num_heads)
        return dqkv, dbias, None


class MergeHeadsFunction(torch.autograd.Function):
    """[B*H, T, hd] -> contiguous [T, B, E] (the out projection needs it contiguous). The backward
    is a copy-free view of dy, [T, B, H, hd] permuted to [B*H, T, hd] (strides hd, B*E, 1): the
    attention bmm's backward takes strided input, so no kernel runs, as with fairseq's own
    `transpose(0, 1).contiguous()`."""

    @staticmethod
    def forward(ctx, x, num_heads):
        ctx.num_heads = num_heads
        return _backend.ops().merge_heads(x, num_heads)

    @staticmethod
    def backward(ctx, dy):
        T, B, E = dy.shape
        H = ctx.num_heads
        return dy.view(T, B, H, E // H).permute(1, 2, 0, 3).reshape(B * H, T, E // H), None


def qkv_bias_split(qkv: torch.Tensor, bias: torch.Tensor, num_heads: int):
    """qkv: [T, B, 3E] + bias [3E] -> (q, k, v), each [B*heads, T, E/heads] contiguous. Under autocast
    the bias takes qkv's dtype, as the projection's own bias would."""
    if _backend.autocast_on(qkv):
        bias = bias.to(qkv.dtype)
    if _backend.use_kernel("qkv_bias_split", qkv.device.type, qkv.dtype):
        return _backend.apply(QkvBiasSplitFunction, qkv, bias, num_heads)
    return reference.qkv_bias_split(qkv, bias, num_heads)


def merge_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """[B*heads, T, head_dim] -> [T, B, E]."""
    if _backend.use_kernel("merge_heads", x.device.type, x.dtype):
        return _backend.apply(MergeHeadsFunction, x, num_heads)
    return reference.merge_heads(x, num_heads)


@_backend.register_fake("attention_softmax_fwd")
def _attention_softmax_fwd_fake(scores, key_padding_mask, causal, scale, p, seed, offset, coords=()):
    out = torch.empty_like(scores) if dropout_threshold(p) else scores.new_empty((0,))
    return torch.empty_like(scores), out


@_backend.register_fake("attention_softmax_bwd")
def _attention_softmax_bwd_fake(dout, y, scale, p, seed, offset, coords=()):
    return torch.empty_like(y)


@_backend.register_fake("attention_dropout")
def _attention_dropout_fake(y, p, seed, offset, coords=()):
    return torch.empty_like(y)


@_backend.register_fake("qkv_bias_split")
def _qkv_bias_split_fake(qkv, bias, num_heads):
    T, B, E3 = qkv.shape
    hd = E3 // 3 // num_heads
    return tuple(qkv.new_empty((B * num_heads, T, hd)) for _ in range(3))


@_backend.register_fake("qkv_bias_split_bwd")
def _qkv_bias_split_bwd_fake(dq, dk, dv, num_heads):
    BH, T, hd = dq.shape
    E = num_heads * hd
    return dq.new_empty((T, BH // num_heads, 3 * E)), dq.new_empty((3 * E,))


@_backend.register_fake("merge_heads")
def _merge_heads_fake(x, num_heads):
    BH, T, hd = x.shape
    return x.new_empty((T, BH // num_heads, num_heads * hd))

