"""A run resumed in any epoch trains on the batches of the run it continues.

The defect (fairseq's since its data2vec 2.0 change, upstream's main too; 0.12.2 seeded with --seed
alone): `FairseqTask.get_batch_iterator` builds a dataset's batches (the shuffled, length-sorted order of
its examples that `batch_by_size` cuts into batches) under `numpy_seed(seed + epoch)`, for the epoch the
iterator is made in. Where fairseq keeps the iterator across epochs (the dataset allows it,
`can_reuse_epoch_itr_across_epochs`: translation, language modelling, denoising, masked LM, ...; no
--update-epoch-batch-itr or --grouped-shuffling; unsharded data) the trainer makes it once, when the process
starts: an uninterrupted run builds its batches in epoch 1 and trains on them in every epoch (in another
order each epoch), a run resumed from a checkpoint of epoch e >= 2 builds them with seed + e: batches of
the same sizes holding other examples, so the resumed run departs from the uninterrupted one at its first
update.

The fix: `FairseqTask.get_batch_iterator` is wrapped. When fairseq is about to make an iterator it keeps
across epochs and whose batches it builds once (the task's `rebuild_batches` unset), for an epoch e >= 2,
the batches are built as the uninterrupted run built them: the iterator is made for epoch 1 (the dataset
at epoch 1, `numpy_seed(seed + 1)`), then it and the dataset are set to epoch e, where fairseq puts them.
Everything else is fairseq's as it is, and needs no fix, since the uninterrupted run and the resumed one
make their iterator for the same epoch: an iterator made in epoch 1, one fairseq makes anew every epoch
(sharded data, --update-epoch-batch-itr, datasets whose sizes change), and batches rebuilt every epoch
(`rebuild_batches`, for epoch e with seed + e). Not covered: with --update-ordered-indices-seed the trainer
passes --seed + e as the seed itself (the order's and the iterator's shuffling's), which this wrapper cannot
tell from --seed.
"""
import inspect

from fairseq.tasks.fairseq_task import FairseqTask

from .wrap import wrap


def _batches_built_once(task, dataset, disable_iterator_cache, update_epoch_batch_itr) -> bool:
    """Whether the iterator about to be made is kept across epochs (fairseq's own test in
    get_batch_iterator, for one not kept yet) with batches built once (no `rebuild_batches`)."""
    return (not disable_iterator_cache and not update_epoch_batch_itr and task.can_reuse_epoch_itr(dataset)
            and dataset not in task.dataset_to_epoch_iter and not getattr(task.cfg, "rebuild_batches", False))


def _wrap_get_batch_iterator(get_batch_iterator):
    signature = inspect.signature(get_batch_iterator)

    def get_batch_iterator_with_first_epoch_batches(self, *args, **kwargs):
        call = signature.bind(self, *args, **kwargs)
        call.apply_defaults()
        given = call.arguments
        epoch, dataset = given["epoch"], given["dataset"]
        if epoch <= 1 or not _batches_built_once(self, dataset, given["disable_iterator_cache"],
                                                 given["update_epoch_batch_itr"]):
            return get_batch_iterator(self, *args, **kwargs)
        given["epoch"] = 1
        epoch_itr = get_batch_iterator(*call.args, **call.kwargs)
        epoch_itr.epoch = epoch  # what fairseq's EpochBatchIterator(epoch=epoch) holds; its batches are built
        dataset.set_epoch(epoch)
        return epoch_itr
    return get_batch_iterator_with_first_epoch_batches


def install() -> None:
    """Wraps fairseq's FairseqTask.get_batch_iterator (idempotent)."""
    wrap(FairseqTask, "get_batch_iterator", _wrap_get_batch_iterator)
