"""Differentiable token + position embedding with dropout over torch.ops.fairseq_lightseq.embedding_{fwd,bwd}."""
__all__ = ["embedding"]

from typing import Optional, Union

import torch
from torch.autograd.function import once_differentiable

from . import _backend, reference
from .dropout_stream import Dropout, as_dropout


class EmbeddingFunction(torch.autograd.Function):
    """out = dropout(scale * weight[tokens] + pos_weight[positions]) with zeros at pad tokens.

    tokens, positions: [B, T] int64 (positions ignored, may be None, when pos_weight is None);
    weight: [V, E]; pos_weight: [P, E] or None, weight's dtype. The dropout mask is the Philox draw
    (seed, offset) over the flat [B, T, E] index (with rows, int64 [B*T]: over the B*T rows of E mapped
    by rows), regenerated in backward. Gradients go to weight and, when it requires grad (learned
    positions), pos_weight; both are deterministic."""

    @staticmethod
    def forward(ctx, tokens, weight, pos_weight, positions, padding_idx, scale, p, seed, offset=0, rows=None):
        out = _backend.ops().embedding_fwd(tokens, weight, pos_weight, positions, padding_idx, scale, p, seed,
                                           offset, rows)
        ctx.save_for_backward(tokens, positions if pos_weight is not None else None, rows)
        ctx.sizes = (weight.shape[0], 0 if pos_weight is None else pos_weight.shape[0])
        ctx.args = (padding_idx, scale, p, seed, offset)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        tokens, positions, rows = ctx.saved_tensors
        want_w, want_p = ctx.needs_input_grad[1], ctx.needs_input_grad[2]
        if not (want_w or want_p):
            return (None,) * 10
        num_w = ctx.sizes[0] if want_w else 0
        num_p = ctx.sizes[1] if want_p else 0
        dw, dp = _backend.ops().embedding_bwd(grad, tokens, positions, num_w, num_p, *ctx.args, rows)
        return None, (dw if want_w else None), (dp if want_p else None), None, None, None, None, None, None, None


def embedding(tokens: torch.Tensor, weight: torch.Tensor, pos_weight: Optional[torch.Tensor], padding_idx: int,
              scale: float = 1.0, p: Union[float, Dropout] = 0.0, training: bool = True,
              positions: Optional[torch.Tensor] = None) -> torch.Tensor:
    """dropout(scale * weight[tokens] + pos_weight[positions]) -> [B, T, E]; pad tokens give zeros.
    tokens: [B, T] int64; weight: [V, E]; pos_weight: [P, E] or None; positions: [B, T] int64
    (default: fairseq's make_positions; incremental decoding passes its own). Gradients flow to weight and
    pos_weight (if it requires grad). Token ids must be in [0, V) and positions in [0, P).
    p: a Dropout draw over the flat [B, T, E] index, or a float (a fresh seed, offset 0); a draw with
    rows (int64 [B*T]) maps the B*T output rows of E (row b*T + t) to padded rows (ops.dropout_stream.Dropout)."""
    d = as_dropout(p, training)
    if _backend.use_kernel("embedding_fwd", weight.device.type, weight.dtype):
        if pos_weight is not None and positions is None:
            positions = reference.make_positions(tokens, padding_idx)
        return _backend.apply(EmbeddingFunction, tokens, weight, pos_weight, positions, padding_idx, float(scale), *d)
    return reference.embedding(tokens, weight, pos_weight, padding_idx, scale, d.p, d.seed, d.offset,
                               positions=positions, rows=d.rows)


@_backend.register_fake("embedding_fwd")
def _embedding_fwd_fake(tokens, weight, pos_weight, positions, padding_idx, scale, p, seed, offset, rows=None):
    return weight.new_empty((*tokens.shape, weight.shape[1]))


@_backend.register_fake("embedding_bwd")
def _embedding_bwd_fake(grad, tokens, positions, num_weights, num_positions, padding_idx, scale, p, seed, offset,
                        rows=None):
    dim = grad.shape[-1]
    return grad.new_empty((num_weights, dim)), grad.new_empty((num_positions, dim))
