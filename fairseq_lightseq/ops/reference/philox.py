"""Philox4x32-10 and the dropout mask, in plain PyTorch (int64 tensors holding uint32 values).

Bit-for-bit the generator of csrc/include/fls/philox.h: the keep bit of element e of a draw with
(seed, offset) depends on (seed, offset + e) only. See that header for the definition.
"""
__all__ = ["keep_bits", "keep_mask", "dropout", "stream_elements"]

import math
from typing import Optional, Sequence

import torch

_M0, _M1 = 0xD2511F53, 0xCD9E8D57
_W0, _W1 = 0x9E3779B9, 0xBB67AE85
_U32 = 0xFFFFFFFF


def _mulhilo(a: torch.Tensor, m: int):
    """hi, lo 32-bit words of a * m, for a: int64 tensor of uint32 values, m: uint32 constant.

    The 64-bit product does not fit int64, so m is split into 16-bit halves."""
    m_lo, m_hi = m & 0xFFFF, m >> 16
    p0 = a * m_lo  # < 2^48
    p1 = a * m_hi  # < 2^48; contributes p1 << 16
    low = p0 + ((p1 & 0xFFFF) << 16)  # < 2^49
    lo = low & _U32
    hi = ((p1 >> 16) + (low >> 32)) & _U32
    return hi, lo


def philox4x32_10(c0, c1, c2, c3, k0: int, k1: int):
    """The four 32-bit outputs for counters (c0..c3: int64 tensors of uint32) and key (k0, k1)."""
    for r in range(10):
        if r > 0:
            k0 = (k0 + _W0) & _U32
            k1 = (k1 + _W1) & _U32
        hi0, lo0 = _mulhilo(c0, _M0)
        hi1, lo1 = _mulhilo(c2, _M1)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3


def dropout_threshold(p: float) -> int:
    """floor(p * 2^24): an element is kept iff (philox_u32 >> 8) >= threshold."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout p must be in [0, 1], got {p}")
    return int(p * 16777216.0)


def keep_bits(e: torch.Tensor, p: float, seed: int) -> torch.Tensor:
    """Keep bits (bool, e's shape) of the stream elements e (int64 tensor, any shape, values >= 0) of
    the draw (p, seed)."""
    threshold = dropout_threshold(p)
    group, lane = e >> 2, e & 3
    seed &= (1 << 64) - 1
    zeros = torch.zeros_like(group)
    outs = philox4x32_10(group & _U32, (group >> 32) & _U32, zeros, zeros, seed & _U32, seed >> 32)
    u = torch.stack(outs, dim=-1).gather(-1, lane.unsqueeze(-1)).squeeze(-1)
    return (u >> 8) >= threshold


def keep_mask(numel: int, p: float, seed: int, offset: int = 0, device=None) -> torch.Tensor:
    """Keep bits [numel] bool of the draw (p, seed, offset) for stream elements offset..offset+numel-1."""
    if offset < 0:
        raise ValueError(f"dropout offset must be >= 0, got {offset}")
    return keep_bits(torch.arange(offset, offset + numel, dtype=torch.int64, device=device), p, seed)


def stream_elements(shape: Sequence[int], offset: int = 0, rows: Optional[torch.Tensor] = None,
                    device=None) -> torch.Tensor:
    """The stream element (int64, `shape`) each element of an op's input of `shape` draws: offset + e
    for flat index e without rows; with rows (int64 [R], R = the product of shape[:-1], values >= 0),
    offset + rows[r] * C + c for element (r, c) of the input read as R rows of its last dim C."""
    if offset < 0:
        raise ValueError(f"dropout offset must be >= 0, got {offset}")
    shape = tuple(shape)
    if rows is None:
        return torch.arange(offset, offset + math.prod(shape), dtype=torch.int64, device=device).view(shape)
    if rows.dtype != torch.int64 or rows.dim() != 1:
        raise ValueError(f"dropout rows must be a 1-D int64 tensor, got {rows.dtype} of shape {tuple(rows.shape)}")
    if device is not None and rows.device != torch.device(device):
        raise ValueError(f"dropout rows must be on the input's device {device}, got {rows.device}")
    width = shape[-1] if shape else 1
    count = math.prod(shape[:-1])
    if rows.numel() != count:
        raise ValueError(f"dropout rows: {rows.numel()} rows for an input of shape {shape} ({count} rows of "
                         f"{width})")
    cols = torch.arange(width, dtype=torch.int64, device=rows.device)
    return (offset + rows.unsqueeze(-1) * width + cols).view(shape)


def dropout_scale(p: float) -> float:
    """Multiplier of kept elements, computed in float32 as the kernels do."""
    return 0.0 if p >= 1.0 else float(torch.tensor(1.0 / (1.0 - p), dtype=torch.float32))


def dropout(x: torch.Tensor, p: float, seed: int, offset: int = 0, rows: Optional[torch.Tensor] = None
            ) -> torch.Tensor:
    """x * keep / (1 - p) with the Philox mask over x's elements in row-major order (with rows: over
    x's rows of its last dim mapped by rows, see stream_elements); x unchanged when the threshold
    is 0 (p < 2^-24)."""
    if dropout_threshold(p) == 0:
        return x
    if rows is None:
        return apply_keep(x, keep_mask(x.numel(), p, seed, offset, x.device).view(x.shape), p)
    return apply_keep(x, keep_bits(stream_elements(x.shape, offset, rows, x.device), p, seed), p)


def apply_keep(x: torch.Tensor, keep: torch.Tensor, p: float) -> torch.Tensor:
    """x * keep / (1 - p), keep: bool, x's shape (the one expression every dropout of the spec uses)."""
    return x * keep.to(x.dtype) * dropout_scale(p)
