"""bias + dropout + residual, and bias + activation + dropout.

Their draw is (p, seed, offset, rows) as ops.dropout_stream.Dropout defines it: rows None (element e of
the flat index draws stream element offset + e) or the row map of packed rows (element (r, c) of the
input read as rows of its last dim C draws offset + rows[r] * C + c)."""
__all__ = ["activation", "bias_dropout_residual", "bias_act_dropout"]

import math
from typing import Optional

import torch

from .philox import dropout

ACTIVATIONS = ("relu", "gelu", "gelu_tanh")


def _acc(x):
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def activation(x: torch.Tensor, act: str) -> torch.Tensor:
    """relu, gelu (erf form, fairseq's default "gelu") or gelu_tanh (fairseq's "gelu_accurate")."""
    if act == "relu":
        return torch.relu(x)
    if act == "gelu":
        return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))
    if act == "gelu_tanh":
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))
    raise ValueError(f"activation must be one of {ACTIVATIONS}, got {act!r}")


def bias_dropout_residual(x, bias, residual, p: float, seed: int = 0, offset: int = 0,
                          rows: Optional[torch.Tensor] = None):
    """residual + dropout(x + bias). x, residual: [..., C]; bias: [C]; rows: None or int64 [R] (R rows of
    C); math in fp32 (fp64)."""
    acc = _acc(x)
    h = dropout(x.to(acc) + bias.to(acc), p, seed, offset, rows)
    return (residual.to(acc) + h).to(x.dtype)


def bias_act_dropout(x, bias, p: float, act: str = "relu", seed: int = 0, offset: int = 0,
                     rows: Optional[torch.Tensor] = None):
    """dropout(act(x + bias)). x: [..., C]; bias: [C]; rows: None or int64 [R] (R rows of C); math in
    fp32 (fp64)."""
    acc = _acc(x)
    return dropout(activation(x.to(acc) + bias.to(acc), act), p, seed, offset, rows).to(x.dtype)
