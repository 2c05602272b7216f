"""Layer norm over the last dimension, the definition the kernels are tested against."""
__all__ = ["layer_norm"]

import torch


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """x: [..., C] float; weight, bias: [C]. Statistics in float32 (float64 for float64 input)."""
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    y = torch.nn.functional.layer_norm(x.to(acc), (x.shape[-1],), weight.to(acc), bias.to(acc), eps)
    return y.to(x.dtype)
