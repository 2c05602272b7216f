"""Differentiable bias+dropout+residual and bias+activation+dropout.

Dropout masks come from the Philox stream (reference/philox.py): a seed is drawn from torch's
default generator per call (only when training with p > 0), so torch.manual_seed reproduces runs.
"""
import torch

from . import _backend, reference


def _draw(p: float, training: bool):
    p = float(p) if training else 0.0
    return p, (_backend.next_seed() if p > 0 else 0)


def bias_dropout_residual(x: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor, p: float,
                          training: bool = True) -> torch.Tensor:
    """residual + dropout(x + bias). x, residual: [..., C]; bias: [C]; one dtype. Returns [..., C]."""
    p, seed = _draw(p, training)
    return reference.bias_dropout_residual(x, bias, residual, p, seed)


def bias_act_dropout(x: torch.Tensor, bias: torch.Tensor, p: float, act: str = "relu",
                     training: bool = True) -> torch.Tensor:
    """dropout(act(x + bias)), act in relu | gelu (erf) | gelu_tanh. x: [..., C]; bias: [C]."""
    p, seed = _draw(p, training)
    return reference.bias_act_dropout(x, bias, p, act, seed)
