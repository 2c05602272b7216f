"""The dropout stream: how every fused op with dropout names its mask, and how the model draws them.

A mask is a function of (p, seed, offset) (`Dropout`): element e of an op's input is kept when Philox
element offset + e of the stream keyed by `seed` passes the threshold of p (ops.reference.philox), so
backward regenerates it instead of keeping it. One forward pass draws one seed (`next_seed`, from
torch's default generator: torch.manual_seed and fairseq's per-update reseeding make runs reproducible)
and gives each dropout site its own range of the stream (`draw(p, active, seed, site)`: offset
site << SITE_BITS), so the masks of two sites never overlap.

A token-wise op over packed rows (the real tokens of a padded [T, B, C] batch, in any order) draws the
padded run's mask with a row map (`at_rows(d, rows)`): its row r is padded row rows[r] (= t * B + b),
so its element (r, c) draws stream element offset + rows[r] * C + c.
"""
from typing import NamedTuple, Optional, Tuple, Union

import torch

__all__ = ["SITE_BITS", "NO_DROPOUT", "Dropout", "as_dropout", "at_rows", "draw", "flat_draw", "next_seed"]


def next_seed() -> int:
    """A dropout seed drawn from torch's default (CPU) generator, so torch.manual_seed (and fairseq's
    per-update reseeding) makes runs reproducible. The draw is a CPU tensor whatever the model's
    device: converting it to an int never waits for a GPU."""
    return int(torch.randint(-(2**63), 2**63 - 1, (), dtype=torch.int64))


# Every dropout site of one forward pass shares one seed and owns the stream elements
# [site << SITE_BITS, (site + 1) << SITE_BITS): disjoint masks for any op of up to 2^40 elements,
# and 2^23 sites before the int64 offset overflows.
SITE_BITS = 40


class Dropout(NamedTuple):
    """One dropout draw of the Philox stream, the argument every fused op with dropout takes.

    p: drop probability in [0, 1] (0 = off); seed: the Philox key (int64); offset: the stream element
    at which this op's mask starts. rows: None, or an int64 [R] tensor (values >= 0) on the op's
    device: the row map of a token-wise op. Without rows the op's element e (of its flat row-major
    index) draws stream element offset + e; with rows the op's input is read as R rows of its last
    dim C and element (r, c) draws stream element offset + rows[r] * C + c. Backward regenerates the
    mask from the same draw, so it is all an op keeps of its dropout. The attention ops and the
    compiled blocks place their elements by their own coordinates and take no rows (`flat_draw`)."""

    p: float = 0.0
    seed: int = 0
    offset: int = 0
    rows: Optional[torch.Tensor] = None


NO_DROPOUT = Dropout()


def at_rows(d: Dropout, rows: torch.Tensor) -> Dropout:
    """d with the row map `rows` (int64 [R], the packed rows' padded row indices, on the op's
    device); d itself when it is off (p == 0), so an eval-mode draw stays NO_DROPOUT."""
    if not d.p:
        return d
    return d._replace(rows=rows)


def flat_draw(d: Dropout, op: str) -> Tuple[float, int, int]:
    """(p, seed, offset) of d for an op that draws over its own flat index or coordinates (`op`
    names it in the error): a ValueError when d has a row map, which such an op cannot follow."""
    if d.rows is not None:
        raise ValueError(f"{op}: the dropout draw has rows (a row map of a token-wise op); this op places its "
                         f"mask by its own coordinates and takes a Dropout without rows")
    return d.p, d.seed, d.offset


def draw(p: float, active: bool = True, seed: Optional[int] = None, site: int = 0) -> Dropout:
    """The draw of dropout site `site` of a forward pass: NO_DROPOUT (no seed drawn, the RNG
    untouched) when not `active` (eval mode) or p == 0; else (p, seed, site << SITE_BITS), with a
    fresh seed from torch's generator when `seed` is None (one call on its own)."""
    if not active or not p:
        return NO_DROPOUT
    return Dropout(float(p), next_seed() if seed is None else seed, site << SITE_BITS)


def as_dropout(p: Union[float, Dropout], training: bool) -> Dropout:
    """The public ops' dropout argument: a Dropout is used as given (NO_DROPOUT when not
    training); a float p draws a fresh seed at offset 0."""
    if isinstance(p, Dropout):
        return p if training else NO_DROPOUT
    return draw(p, training)
