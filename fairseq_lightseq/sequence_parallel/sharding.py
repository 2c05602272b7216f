"""Which rows of a time axis a sequence-parallel rank holds, and the dropout offsets that follow.

The P ranks of a sequence-parallel (SP) group get the same batch. Each pads the time axis (S for the
encoder, T for the decoder) with pad tokens to a multiple of P and keeps the contiguous rows
[start, stop) of the time-major [T, B, C] streams. Everything computed from whole rows (padding masks,
fairseq's make_positions) is computed on the padded tokens first, then sliced.

Dropout stays the single-process draw: a Philox bit depends on (seed, offset + flat index), and the
time-major rows [t0, t1) of a [T, B, C] tensor are the flat range from t0 * B * C, so a token-wise op
on the local rows takes its site's offset plus t0 * B * C (`Shard.token_offset`).
"""
from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F

from ..ops.dropout_stream import Dropout

MODES = ("ulysses", "allgather")


class Shard(NamedTuple):
    """Rows [start, stop) of a time axis of `total` real steps, padded to `padded` = size * (stop - start).

    group: the SP process group; size: P; rank: this rank's index in the group; mode: one of MODES."""

    group: object
    size: int
    rank: int
    mode: str
    total: int
    padded: int
    start: int
    stop: int

    @property
    def rows(self) -> int:
        return self.stop - self.start

    def pad(self, tokens: torch.Tensor, pad_idx: int) -> torch.Tensor:
        """[B, total] int64 -> [B, padded], pad tokens appended at the end of every row."""
        extra = self.padded - tokens.size(1)
        return F.pad(tokens, (0, extra), value=pad_idx) if extra else tokens

    def local(self, t: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """This rank's rows of a padded tensor along `dim` (default: the time dim of [B, T])."""
        return t.narrow(dim, self.start, self.rows)

    def token_offset(self, d: Dropout, batch: int, width: int) -> Dropout:
        """The draw `d` of a token-wise op over [T, B, width], moved to this rank's first row."""
        if not d.p:
            return d
        return d._replace(offset=d.offset + self.start * batch * width)


class SequenceParallel(NamedTuple):
    """A model's SP settings: the group (None when P == 1), P, this rank's index, and the mode."""

    group: object
    size: int
    rank: int
    mode: str

    def shard(self, total: int) -> Shard:
        """The shard of a time axis of `total` steps (padded up to a multiple of P, at least P)."""
        rows = max(1, -(-total // self.size))
        return Shard(self.group, self.size, self.rank, self.mode, total, rows * self.size, self.rank * rows,
                     (self.rank + 1) * rows)


def shard_or_none(sp: Optional[SequenceParallel], total: int, incremental: bool = False) -> Optional[Shard]:
    """The shard for a forward pass, or None when it runs unsharded: no SP (P == 1 or no group) or
    incremental decoding (never sharded)."""
    if sp is None or sp.size == 1 or incremental:
        return None
    return sp.shard(total)


# The key under which a sequence-parallel model's forward records its rows' Shard in its extra output.
EXTRA_KEY = "sequence_parallel"


def recorded_shard(net_output) -> Optional[Shard]:
    """The Shard a model's forward recorded in its extra output (net_output[1][EXTRA_KEY]: the rows its
    features or logits hold), None without sequence parallelism or an extra dict."""
    extra = net_output[1] if isinstance(net_output, (tuple, list)) and len(net_output) > 1 else None
    return extra.get(EXTRA_KEY) if isinstance(extra, dict) else None
