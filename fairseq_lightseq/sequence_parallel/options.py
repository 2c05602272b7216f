"""`--sequence-parallel-size` / `--sequence-parallel-mode` of every ls_* architecture: the
options, the combinations refused at model build, and the setup of a distributed run.

World W = D x P: SP groups are contiguous blocks of P ranks (keep them inside a node), which all get the
same batches: the trainer's batch iterator is sharded W/P ways (shard rank // P) instead of W ways.
fairseq's data-parallel group stays the world, so its one gradient all-reduce sums over the SP ranks
(each holds a partial gradient) and averages over the data-parallel shards.
"""
import argparse
import functools

import torch.distributed as dist

from ..errors import ConfigurationError
from .groups import new_sequence_parallel_group
from .sharding import MODES, SequenceParallel

# The criteria that count a rank's share of the targets (the others would count every token P times), for
# the models with a decoder; an encoder-only model passes its own (ls_roberta: ls_masked_lm).
CRITERIA = ("ls_label_smoothed_cross_entropy", "ls_cross_entropy")
# fairseq's engines that do not all-reduce each gradient over the world, which the SP ranks' partial
# gradients need: fully_sharded reduce-scatters shards of them, slowmo averages parameters.
REFUSED_DDP_BACKENDS = ("fully_sharded", "slowmo")


def add_args(parser) -> None:
    parser.add_argument("--sequence-parallel-size", type=int, metavar="P",
                        help="split each batch's time axis over P ranks (default 1: off); P must divide the "
                             "number of processes")
    parser.add_argument("--sequence-parallel-mode", choices=MODES,
                        help="how attention exchanges the shards: ulysses (default; heads %% P == 0) or "
                             "allgather (any head count)")


def size_and_mode(args):
    """(P, mode) with the defaults (1, ulysses) for checkpoints and namespaces without the options."""
    size = getattr(args, "sequence_parallel_size", None)
    return (1 if size is None else int(size)), getattr(args, "sequence_parallel_mode", None) or "ulysses"


def check(args, sides=("encoder", "decoder"), criteria=CRITERIA) -> None:
    """Raise ConfigurationError naming the option when sequence parallelism cannot run with these options.
    sides: the stacks the model has (ulysses needs each one's head count divisible by P); criteria: the
    criteria that count a rank's share with this model."""
    P, mode = size_and_mode(args)
    if P < 1:
        raise ConfigurationError(f"--sequence-parallel-size must be >= 1, got {P}")
    if mode not in MODES:
        raise ConfigurationError(f"--sequence-parallel-mode must be one of {', '.join(MODES)}, got {mode!r}")
    if P == 1:
        return
    # first the size itself: no other option makes a size that does not divide the world run
    world = _world_size(args)
    if world % P:
        raise ConfigurationError(f"--sequence-parallel-size {P} must divide the number of processes "
                                 f"(--distributed-world-size {world})")
    if mode == "ulysses":
        for side in sides:
            heads = int(getattr(args, f"{side}_attention_heads"))
            if heads % P:
                raise ConfigurationError(f"--sequence-parallel-mode ulysses needs --{side}-attention-heads "
                                         f"({heads}) divisible by --sequence-parallel-size ({P}); use "
                                         f"--sequence-parallel-mode allgather")

    def get(name, default=None):
        return getattr(args, name, default)

    check_ddp_backend(args, get("ddp_backend"))
    refused = [
        ("--criterion " + str(get("criterion")), get("criterion") not in (None, *criteria)),
        ("--use-bmuf", bool(get("use_bmuf"))),
        ("--model-parallel-size " + str(get("model_parallel_size")), (get("model_parallel_size") or 1) > 1),
        ("--tpu", bool(get("tpu"))),
        ("--eval-bleu", bool(get("eval_bleu"))),
        ("--ignore-prefix-size " + str(get("ignore_prefix_size")), (get("ignore_prefix_size") or 0) > 0),
    ]
    for option, bad in refused:
        if bad:
            extra = f" (it needs --criterion {' or '.join(criteria)})" if option.startswith("--criterion") else ""
            raise ConfigurationError(f"--sequence-parallel-size {P} does not support {option}{extra}")


def check_ddp_backend(args, ddp_backend) -> None:
    """Raise ConfigurationError when args ask for sequence parallelism under `ddp_backend` (--ddp-backend) and
    it is one of REFUSED_DDP_BACKENDS. fairseq-train imports fairscale for fully_sharded before it builds the
    model, so this part of `check` also runs before that (patches.fairscale_engines)."""
    P, _ = size_and_mode(args)
    if P > 1 and ddp_backend in REFUSED_DDP_BACKENDS:
        raise ConfigurationError(f"--sequence-parallel-size {P} does not support --ddp-backend {ddp_backend}")


def _world_size(args) -> int:
    """The number of processes: torch.distributed's once initialised (under torchrun or SLURM fairseq
    learns it from the environment after the model's arguments were recorded), else
    --distributed-world-size."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return int(getattr(args, "distributed_world_size", None) or 1)


def setup(args, task):
    """The model's SequenceParallel, or None when it runs unsharded (P == 1, or no torch.distributed:
    fairseq-generate and other single-process tools run an SP checkpoint as it is). In a distributed
    run, creates the groups and shards the task's batch iterator W/P ways, and records the world size in
    args (saved with the checkpoint as the model's config): under torchrun fairseq learns it from the
    environment only after the model's arguments were recorded (--distributed-world-size 1), and a
    one-process tool would then refuse the checkpoint (check: P must divide the number of processes)."""
    P, mode = size_and_mode(args)
    if P == 1 or not dist.is_available() or not dist.is_initialized():
        return None
    if isinstance(args, argparse.Namespace):
        args.distributed_world_size = dist.get_world_size()
    g = new_sequence_parallel_group(P)
    _shard_batches(task, g.num_shards, g.index)
    return SequenceParallel(g.group, P, g.rank, mode)


def _shard_batches(task, num_shards: int, shard_id: int) -> None:
    """Make the task's get_batch_iterator (called by fairseq's trainer with the data-parallel world)
    give every rank of an SP group the same batches: shard num_shards ways, shard shard_id. Wraps the
    instance's bound method once; no fairseq class is changed."""
    original = task.get_batch_iterator
    if getattr(original, "sequence_parallel_shards", None) is not None:
        return

    @functools.wraps(original)
    def get_batch_iterator(*args, **kwargs):
        kwargs["num_shards"], kwargs["shard_id"] = num_shards, shard_id
        return original(*args, **kwargs)

    get_batch_iterator.sequence_parallel_shards = (num_shards, shard_id)
    task.get_batch_iterator = get_batch_iterator
