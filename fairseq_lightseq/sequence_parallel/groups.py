"""The sequence-parallel (SP) process groups: the world of W = D x P ranks as D contiguous blocks
[k*P, (k+1)*P) of P ranks (keep a block inside a node: its collectives run every layer). The P ranks
of a block share each batch (data-parallel shard k = rank // P of W // P); fairseq's data-parallel
all-reduce stays over the whole world."""
from typing import NamedTuple, Optional

import torch.distributed as dist

from ..errors import ConfigurationError


class SequenceParallelGroup(NamedTuple):
    group: Optional["dist.ProcessGroup"]  # this rank's block; None only without torch.distributed
    size: int  # P, ranks per block
    rank: int  # this rank's place in its block, 0..P-1 (the rows of the time axis it keeps)
    index: int  # rank // P: the block, i.e. the data-parallel shard this rank reads
    num_shards: int  # W // P: data-parallel shards


TRIVIAL = SequenceParallelGroup(group=None, size=1, rank=0, index=0, num_shards=1)

_CACHE = {}  # size -> (the world group it was made in, SequenceParallelGroup)


def new_sequence_parallel_group(size: int) -> SequenceParallelGroup:
    """This rank's SP group of `size` (P) ranks.

    With torch.distributed initialised (world W): P must divide W. Every rank must call this, with
    the same sizes in the same order (torch's new_group rule: each rank creates every block's group);
    a second call with the same size in the same world returns the same groups. P = 1 gives groups of
    one rank (the collectives are then the identity). Without torch.distributed: only P = 1, the
    trivial group (group None, rank 0, one shard).
    """
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ConfigurationError(f"--sequence-parallel-size must be a positive integer, got {size!r}")
    if not (dist.is_available() and dist.is_initialized()):
        if size != 1:
            raise ConfigurationError(f"--sequence-parallel-size {size} needs torch.distributed initialised with a "
                                     f"world size that is a multiple of {size} (without it, only 1)")
        return TRIVIAL
    world_size, rank = dist.get_world_size(), dist.get_rank()
    if world_size % size:
        raise ConfigurationError(f"--sequence-parallel-size {size} must divide the world size {world_size} "
                                 f"(P={size} ranks per sequence-parallel group, W={world_size})")
    world = dist.group.WORLD
    cached = _CACHE.get(size)
    if cached is not None and cached[0] is world:  # a re-initialised world needs new groups
        return cached[1]
    mine = None
    for k in range(world_size // size):
        g = dist.new_group(list(range(k * size, (k + 1) * size)))
        if k == rank // size:
            mine = g
    sp = SequenceParallelGroup(group=mine, size=size, rank=rank % size, index=rank // size,
                               num_shards=world_size // size)
    _CACHE[size] = (world, sp)
    return sp
