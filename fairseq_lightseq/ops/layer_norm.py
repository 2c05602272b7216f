"""Differentiable fused layer norm over torch.ops.fairseq_lightseq.layer_norm_{fwd,bwd}."""
__all__ = ["layer_norm"]

import torch

from . import _backend, reference


class LayerNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        y, mean, rstd = _backend.ops().layer_norm_fwd(x, weight, bias, eps)
        ctx.save_for_backward(x, weight, mean, rstd)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, mean, rstd = ctx.saved_tensors
        dx, dweight, dbias = _backend.ops().layer_norm_bwd(dy, x, weight, mean, rstd)
        return dx, dweight, dbias, None


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """Layer norm over the last dim. x: [..., C] fp32/fp64/bf16 (CPU) or fp32/fp16/bf16 (CUDA);
    weight, bias: [C], same dtype. Default eps 1e-5 as fairseq. Returns [..., C], x's dtype.
    Under autocast mixed dtypes are promoted, so fp32 weights give an fp32 result, as autocast runs
    PyTorch's layer norm in fp32."""
    if _backend.autocast_on(x):
        x, weight, bias = _backend.promote(x, weight, bias)
    if _backend.use_kernel("layer_norm_fwd", x.device.type, x.dtype):
        return _backend.apply(LayerNormFunction, x, weight, bias, eps)
    return reference.layer_norm(x, weight, bias, eps)


@_backend.register_fake("layer_norm_fwd")
def _layer_norm_fwd_fake(x, weight, bias, eps):
    rows = x.numel() // x.shape[-1]
    stat = torch.float64 if x.dtype == torch.float64 else torch.float32
    return torch.empty_like(x), x.new_empty((rows,), dtype=stat), x.new_empty((rows,), dtype=stat)


@_backend.register_fake("layer_norm_bwd")
def _layer_norm_bwd_fake(dy, x, weight, mean, rstd):
    return torch.empty_like(x), torch.empty_like(weight), torch.empty_like(weight)
