"""Differentiable bias+dropout+residual, bias+activation+dropout and plain dropout.

Dropout masks come from the Philox stream (reference/philox.py, csrc/include/fls/philox.h): each op
takes its draw as a `dropout_stream.Dropout` (p, seed, offset, rows), or a float p for which a seed is drawn
from torch's default generator (only when training with p > 0), so torch.manual_seed reproduces runs.
The mask is never stored: backward regenerates it from the draw. A draw with rows (packed rows of a
padded batch, `dropout_stream.at_rows`) reads the input as R rows of its last dim C and gives row r the
mask of padded row rows[r].
"""
__all__ = ["bias_dropout_residual", "bias_act_dropout", "dropout", "dropout_mask"]

from typing import Optional, Union

import torch

from . import _backend, reference
from .dropout_stream import Dropout, as_dropout
from .reference.dropout import ACTIVATIONS
from .reference.philox import apply_keep, dropout_threshold


class BiasDropoutResidualFunction(torch.autograd.Function):
    """residual + dropout(x + bias) with an explicit draw; apply(x, bias, residual, p, seed, offset, rows=None).
    Saves the row map (if any) for backward, which draws the mask again."""

    @staticmethod
    def forward(ctx, x, bias, residual, p, seed, offset, rows=None):
        ctx.save_for_backward(rows)
        ctx.draw = (p, seed, offset)
        return _backend.ops().bias_dropout_residual_fwd(x, bias, residual, p, seed, offset, rows)

    @staticmethod
    def backward(ctx, dy):
        dx = dbias = None
        if ctx.needs_input_grad[0] or ctx.needs_input_grad[1]:
            (rows,) = ctx.saved_tensors
            dx, dbias = _backend.ops().bias_dropout_residual_bwd(dy, *ctx.draw, rows)
        return dx, dbias, dy, None, None, None, None


class BiasActDropoutFunction(torch.autograd.Function):
    """dropout(act(x + bias)) with an explicit draw; apply(x, bias, p, act, seed, offset, rows=None).
    Saves x, bias and the row map (not the activation output or the mask) and recomputes act'(x + bias)
    in backward."""

    @staticmethod
    def forward(ctx, x, bias, p, act, seed, offset, rows=None):
        ctx.save_for_backward(x, bias, rows)
        ctx.draw = (p, act, seed, offset)
        return _backend.ops().bias_act_dropout_fwd(x, bias, p, act, seed, offset, rows)

    @staticmethod
    def backward(ctx, dy):
        x, bias, rows = ctx.saved_tensors
        dx, dbias = _backend.ops().bias_act_dropout_bwd(dy, x, bias, *ctx.draw, rows)
        return dx, dbias, None, None, None, None, None


def bias_dropout_residual(x: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor, p: Union[float, Dropout],
                          training: bool = True) -> torch.Tensor:
    """residual + dropout(x + bias). x, residual: [..., C]; bias: [C]; one dtype (CPU fp32/fp64/bf16,
    CUDA fp32/fp16/bf16); p: a Dropout draw (its rows, if any: int64 [R], R = x.numel() // C), or a
    float (a fresh seed, offset 0). Returns [..., C] in
    x's dtype; math in fp32 (fp64). Under autocast the bias
    takes x's dtype (it is the bias of the linear that made x), then x and residual are promoted, so
    an fp32 residual stream stays fp32 as with PyTorch's own `residual + dropout(x)`."""
    if _backend.autocast_on(x):
        x, bias, residual = _backend.promote(x, bias.to(x.dtype), residual)
    d = as_dropout(p, training)
    if _backend.use_kernel("bias_dropout_residual_fwd", x.device.type, x.dtype):
        return _backend.apply(BiasDropoutResidualFunction, x, bias, residual, *d)
    return reference.bias_dropout_residual(x, bias, residual, *d)


def bias_act_dropout(x: torch.Tensor, bias: torch.Tensor, p: Union[float, Dropout], act: str = "relu",
                     training: bool = True) -> torch.Tensor:
    """dropout(act(x + bias)), act in relu | gelu (erf) | gelu_tanh. x: [..., C]; bias: [C]; one dtype;
    p: a Dropout draw (its rows, if any: int64 [R], R = x.numel() // C), or a float. Returns [..., C] in
    x's dtype; math in fp32 (fp64). Under autocast the bias takes x's dtype, as the linear's own bias
    would."""
    if _backend.autocast_on(x):
        bias = bias.to(x.dtype)
    if act not in ACTIVATIONS:
        raise ValueError(f"bias_act_dropout: act must be one of {ACTIVATIONS}, got {act!r}")
    d = as_dropout(p, training)
    if _backend.use_kernel("bias_act_dropout_fwd", x.device.type, x.dtype):
        return _backend.apply(BiasActDropoutFunction, x, bias, d.p, act, d.seed, d.offset, d.rows)
    return reference.bias_act_dropout(x, bias, d.p, act, d.seed, d.offset, d.rows)


def dropout_mask(numel: int, p: float, seed: int, offset: int = 0, device="cpu",
                 rows: Optional[torch.Tensor] = None, cols: int = 0) -> torch.Tensor:
    """Keep bits [numel] bool of the draw (p, seed) for stream elements offset .. offset+numel-1, from
    the compiled generator (the one every fused dropout uses); reference.keep_mask is its spec. With
    rows (int64 [R] on `device`, numel = R * cols): R rows of cols, row r the bits of stream elements
    offset + rows[r] * cols .. + cols - 1 (reference.stream_elements)."""
    return _backend.ops().dropout_mask(numel, p, seed, offset, torch.device(device), rows, cols)


def _masked(x: torch.Tensor, p: float, seed: int, offset: int, rows: Optional[torch.Tensor]) -> torch.Tensor:
    """x * keep / (1 - p), keep the compiled mask of the draw (p, seed, offset, rows) over x's elements."""
    cols = x.shape[-1] if x.dim() else 1
    return apply_keep(x, dropout_mask(x.numel(), p, seed, offset, x.device, rows, cols).view(x.shape), p)


class DropoutFunction(torch.autograd.Function):
    """x * keep / (1 - p) with keep from the compiled dropout_mask; apply(x, p, seed, offset, rows=None).
    Backward multiplies by the same mask, regenerated from the draw rather than saved (the other
    dropouts do the same: nothing of the mask is kept between forward and backward; rows, the row
    map, is saved)."""

    @staticmethod
    def forward(ctx, x, p, seed, offset, rows=None):
        ctx.save_for_backward(rows)
        ctx.draw = (p, seed, offset)
        return _masked(x, p, seed, offset, rows)

    @staticmethod
    def backward(ctx, dy):
        (rows,) = ctx.saved_tensors
        return _masked(dy, *ctx.draw, rows), None, None, None, None


def _mask_compiled(device: torch.device) -> bool:
    """Whether the compiled dropout_mask draws on `device`. It is registered for every backend (it
    has no tensor argument to dispatch on), so has_kernel does not see it: CPU whenever the library
    is loaded, CUDA in a CUDA build. Otherwise warns once (use_kernel) and returns False."""
    on_device = device.type == "cpu" or (device.type == "cuda" and _backend.BUILD_INFO["with_cuda"])
    if _backend._C is not None and on_device:
        return True
    return _backend.use_kernel("dropout_mask", device.type)


def dropout(x: torch.Tensor, p: Union[float, Dropout], training: bool = True) -> torch.Tensor:
    """x * keep / (1 - p), keep = the Philox mask over x's flat (row-major) index: element e draws stream
    element offset + e (with rows: element (r, c) of x read as R rows of its last dim C draws
    offset + rows[r] * C + c). x: any shape and float dtype; p: a Dropout draw, or a float (a fresh seed,
    offset 0). Returns x's shape and dtype (x itself when off: not training, or floor(p * 2^24) == 0).
    The dropout of fairseq's --layernorm-embedding; reference.dropout is its spec."""
    d = as_dropout(p, training)
    if dropout_threshold(d.p) == 0:
        return x
    if _mask_compiled(x.device):
        return _backend.apply(DropoutFunction, x, *d)
    return reference.dropout(x, *d)


@_backend.register_fake("bias_dropout_residual_fwd")
def _bias_dropout_residual_fwd_fake(x, bias, residual, p, seed, offset, rows=None):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@_backend.register_fake("bias_dropout_residual_bwd")
def _bias_dropout_residual_bwd_fake(dy, p, seed, offset, rows=None):
    return torch.empty_like(dy, memory_format=torch.contiguous_format), dy.new_empty((dy.shape[-1],))


@_backend.register_fake("bias_act_dropout_fwd")
def _bias_act_dropout_fwd_fake(x, bias, p, act, seed, offset, rows=None):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@_backend.register_fake("bias_act_dropout_bwd")
def _bias_act_dropout_bwd_fake(dy, x, bias, p, act, seed, offset, rows=None):
    return torch.empty_like(dy, memory_format=torch.contiguous_format), torch.empty_like(bias)


@_backend.register_fake("dropout_mask")
def _dropout_mask_fake(numel, p, seed, offset, device, rows=None, cols=0):
    return torch.empty((numel,), dtype=torch.bool, device=device)
