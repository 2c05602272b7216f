"""Packed rows: where the real tokens of a padded batch sit, made once per padded side and batch (--ls-packed).

A padded batch [B, T] holds each sentence as one run of real tokens, its padding on the left (fairseq's
translation sources by default) or on the right. Packed, the real tokens are N rows, sentence by sentence
in order, each sentence's tokens in position order: the layers run their token-wise ops on [N, C] rows and
their attention over the sentences' row ranges (ops.varlen_attention), so no layer computes on padding.

Everything a layer needs is made here once, on the host (one read of each padded side's mask per batch: on a
GPU the one device-to-host copy of the packed step, before any layer runs, never one per layer), and handed
to every layer:
- `index`: the batch-major flat position b * T + t of each real token ([B, T] tensors -> `gather`);
- `rows`: its time-major row t * B + b in the padded [T, B, C] streams, which is where the padded run's
  token-wise dropout masks put it (ops.dropout_stream.at_rows: a packed op draws the padded op's mask);
- `cu_seqlens` and `max_len` for the attention, `starts` (the first real position of each row) for the
  attention's dropout coordinates (`coords`), and the host `lengths` and `first` positions.
"""
from typing import NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from ..errors import ConfigurationError
from ..ops.varlen_attention import VarlenCoords

# The key of a model's extra output under which a packed forward records the Packing of the rows its
# features hold (the criterion gathers its targets with it).
EXTRA_KEY = "packing"


class Packing(NamedTuple):
    """The packed layout of one padded [B, T] batch. Tensors on the batch's device.

    index: int64 [N] batch-major positions b*T + t of the real tokens; rows: int64 [N] time-major rows t*B + b;
    cu_seqlens: int32 [B+1] (0, then the running sum of the lengths); starts: int32 [B] first real position
    of each row; lengths, first: the same on the host (tuples of B ints); B, T, N, max_len: ints."""

    index: Tensor
    rows: Tensor
    cu_seqlens: Tensor
    starts: Tensor
    lengths: Tuple[int, ...]
    first: Tuple[int, ...]
    B: int
    T: int
    N: int
    max_len: int

    @property
    def has_padding(self) -> bool:
        return self.N < self.B * self.T

    def gather(self, t: Tensor) -> Tensor:
        """[B, T, ...] -> the real positions' [N, ...], packed order."""
        return t.reshape(self.B * self.T, *t.shape[2:]).index_select(0, self.index)

    def first_rows(self) -> Optional[Tensor]:
        """int64 [B]: the packed row of each sentence's position 0, or None when a sentence does not start
        there (left padding, or an empty row), where a head reading position 0 needs the padded rows."""
        if any(s != 0 or n == 0 for s, n in zip(self.first, self.lengths)):
            return None
        return self.cu_seqlens[:-1].long()


def pack(padding_mask: Tensor) -> Packing:
    """The Packing of a [B, T] bool padding mask (True at padding). Each row must hold one run of real tokens
    (padding only before it, after it, or neither): ConfigurationError naming the row otherwise."""
    B, T = padding_mask.shape
    real = ~padding_mask.detach().to("cpu", torch.bool)  # the one read of the batch on the host
    lengths = real.sum(1)
    # first real position (T for an empty row) and the run check: the real tokens of row b are t in [s, s + n)
    position = torch.arange(T).expand(B, T)
    first = torch.where(real, position, T).amin(1) if T else torch.zeros(B, dtype=torch.long)
    last = torch.where(real, position, -1).amax(1) if T else torch.full((B,), -1, dtype=torch.long)
    broken = (lengths > 0) & (last - first + 1 != lengths)
    if bool(broken.any()):
        b = int(broken.nonzero()[0, 0])
        raise ConfigurationError(f"--ls-packed: row {b} of the batch has padding between its tokens; "
                                 "packing needs each row's tokens in one run")
    first = torch.where(lengths > 0, first, 0)
    b_idx, t_idx = real.nonzero(as_tuple=True)  # row-major: sentence by sentence, positions in order
    device = padding_mask.device
    cu = torch.zeros(B + 1, dtype=torch.int32)
    cu[1:] = lengths.cumsum(0)

    def to_device(t):
        return t.to(device, non_blocking=True)

    N = int(b_idx.numel())
    return Packing(to_device(b_idx * T + t_idx), to_device(t_idx * B + b_idx), to_device(cu),
                   to_device(first.to(torch.int32)), tuple(lengths.tolist()), tuple(first.tolist()), B, T, N,
                   int(lengths.max()) if B else 0)


def coords(queries: Packing, keys: Packing) -> VarlenCoords:
    """The attention's dropout coordinates: queries of `queries` over keys of `keys` (the same Packing for
    self-attention), placed in the padded [B, H, Tq, Tk] problem."""
    return VarlenCoords(queries.T, keys.T, torch.stack([queries.starts, keys.starts], dim=1).contiguous())


def recorded_packing(net_output) -> Optional[Packing]:
    """The Packing a packed forward recorded in its extra output (net_output[1][EXTRA_KEY]: the rows its
    features hold), None for a padded forward or an output without an extra dict."""
    extra = net_output[1] if isinstance(net_output, (tuple, list)) and len(net_output) > 1 else None
    return extra.get(EXTRA_KEY) if isinstance(extra, dict) else None
