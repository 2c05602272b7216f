"""Dropout masks that do not depend on how an update's batches are split over ranks and --update-freq steps
(ls_* models): W ranks with --update-freq F draw, for each batch of an update, the masks that 1 process with
--update-freq W x F draws for it.

The defect (fairseq's, and its own models have it too): fairseq's trainer seeds torch's generators with
--seed + the update number once per update, on every rank (`Trainer._set_seed`), and each forward draws its
dropout from them (our Philox seed, ops/dropout_stream.next_seed; fairseq's dropout, its masks). The batches
of an update are the same whatever the split: fairseq shards them round-robin, so batch k of an update is
micro-batch k // D of data-parallel shard k % D (D shards). Their seeds are not: every rank's first
micro-batch draws the update's first seed, where one process draws it for its first micro-batch only and
the next ones for the others.

The fix: fairseq's `Trainer.train_step` is wrapped. For an ls_* model, before micro-batch i of shard r
it seeds torch's generators (fairseq's `utils.set_torch_seed`, as `_set_seed` does) with
`batch_seed(--seed + update number, i * D + r)`, a seed of the batch's place in the update. The update's
first batch keeps fairseq's seed (and is not reseeded), so one process without --update-freq draws what
fairseq's seeding gives it; every seed depends on the update number and the batch's place only, so runs stay
reproducible and resume bit for bit. The P ranks of a sequence-parallel group read the same batches and
draw the same seeds (D is then W / P and r the group's shard). fairseq's own models are left as fairseq runs
them.
"""
import itertools

from fairseq import utils
from fairseq.trainer import Trainer

from .wrap import wrap

# apart from --seed + the update number, a batch's seeds are this far from the next place's: no two places of
# any two updates share a seed
STRIDE = 2 ** 32
_MISSING = object()


def batch_seed(update_seed: int, place: int) -> int:
    """The torch seed of the batch at `place` (i * D + r) of the update whose fairseq seed is `update_seed`."""
    return update_seed + place * STRIDE


def _shards(trainer) -> tuple:
    """(D, r): the number of data-parallel shards and this rank's, as the trainer's batch iterator shards
    the batches (sequence parallelism: the groups', sequence_parallel.options)."""
    sharded = getattr(trainer.task.get_batch_iterator, "sequence_parallel_shards", None)
    return sharded if sharded is not None else (trainer.data_parallel_world_size, trainer.data_parallel_rank)


def _wrap_train_step(train_step):
    def seeded_train_step(self, samples, raise_oom=False):
        from ..models.common import LSModelMixin

        if not isinstance(self.get_model(), LSModelMixin):
            return train_step(self, samples, raise_oom)
        task, (shards, shard) = self.task, _shards(self)
        update_seed = self.cfg.common.seed + self.get_num_updates()
        per_batch, micro = task.train_step, itertools.count()

        def train_one(*args, **kwargs):
            place = next(micro) * shards + shard
            if place:  # the first place keeps the seed fairseq's _set_seed gave the update
                utils.set_torch_seed(batch_seed(update_seed, place))
            return per_batch(*args, **kwargs)

        own = vars(task).get("train_step", _MISSING)
        task.train_step = train_one  # this call only: fairseq's loop calls it once per micro-batch
        try:
            return train_step(self, samples, raise_oom)
        finally:
            if own is _MISSING:
                del task.train_step
            else:
                task.train_step = own
    return seeded_train_step


def install() -> None:
    """Wraps fairseq's Trainer.train_step (idempotent)."""
    wrap(Trainer, "train_step", _wrap_train_step)
