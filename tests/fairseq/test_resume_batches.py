"""The batches of a resumed run (patches/resume_batches.py), on fairseq's translation task over a real data-bin,
in process: a task made afresh (as a resumed process makes it) whose iterator is made for epoch e and restored
from a checkpoint's iterator state (the start of epoch e, or batches into it) yields, batch for batch, the
examples that the uninterrupted run's iterator (made in epoch 1 and kept) yields in epoch e. A task with
fairseq's `rebuild_batches` (the option of audio_pretraining, audio_finetuning and data2vec's tasks) rebuilds its
batches every epoch as fairseq does, in the uninterrupted and the resumed run alike. The command-line runs that
resume in epoch 2 and later (translation and BART, 1 process and 2 ranks, kill -9) are tests/e2e/test_resume_epochs.py
and tests/e2e/test_distributed.py."""
import pytest

import fairseq_lightseq  # noqa: F401  (installs the patches)
from fairseq import options, tasks

from support.cli import make_data_bin

EPOCHS = 3
MAX_TOKENS = 100  # 200 pairs of 4 to 9 tokens: ~15 batches an epoch


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return make_data_bin(str(tmp_path_factory.mktemp("resume_batches")))


def fresh_task(data_bin, rebuild_batches=False):
    """fairseq's translation task with its train split loaded, as a fairseq-train process makes it."""
    args = options.parse_args_and_arch(options.get_training_parser(), [
        data_bin, "--task", "translation", "--arch", "transformer", "--max-tokens", str(MAX_TOKENS), "--seed", "3"])
    task = tasks.setup_task(args)
    task.cfg.rebuild_batches = rebuild_batches  # (a field of the task's config where the task offers it)
    task.load_dataset("train")
    return task


def iterator(task, epoch):
    """The train iterator fairseq's trainer asks the task for in `epoch` (Trainer.get_train_iterator's call)."""
    return task.get_batch_iterator(task.dataset("train"), max_tokens=MAX_TOKENS, seed=3, epoch=epoch,
                                   ignore_invalid_inputs=True)


def epoch_ids(epoch_itr):
    """The example ids of each batch of the iterator's next epoch, in training order."""
    return [batch["id"].tolist() for batch in epoch_itr.next_epoch_itr(shuffle=True)]


def uninterrupted(data_bin, rebuild_batches=False):
    """{epoch: batches} of one run through EPOCHS epochs, asking for the iterator every epoch as fairseq-train
    does (it gets the one made in epoch 1 back)."""
    task = fresh_task(data_bin, rebuild_batches)
    return {epoch: epoch_ids(iterator(task, epoch)) for epoch in range(1, EPOCHS + 1)}


def resumed(data_bin, epoch, iterations_in_epoch, rebuild_batches=False):
    """The batches a run resumed from a checkpoint of `epoch`, `iterations_in_epoch` batches in, trains on."""
    epoch_itr = iterator(fresh_task(data_bin, rebuild_batches), epoch)
    epoch_itr.load_state_dict({"version": 2, "epoch": epoch, "iterations_in_epoch": iterations_in_epoch,
                               "shuffle": True})
    return epoch_ids(epoch_itr)


@pytest.fixture(scope="module")
def whole(data_bin):
    return uninterrupted(data_bin)


@pytest.mark.parametrize("epoch", range(1, EPOCHS + 1))
@pytest.mark.parametrize("iterations_in_epoch", [0, 5])
def test_resumed_run_trains_on_the_uninterrupted_runs_batches(data_bin, whole, epoch, iterations_in_epoch):
    assert whole[1] != whole[2] and sorted(whole[1]) == sorted(whole[2])  # the same batches, shuffled per epoch
    assert resumed(data_bin, epoch, iterations_in_epoch) == whole[epoch][iterations_in_epoch:]


def test_rebuild_batches_rebuilds_them_every_epoch(data_bin):
    whole = uninterrupted(data_bin, rebuild_batches=True)
    assert sorted(whole[1]) != sorted(whole[2])  # other batches, not only another order
    for epoch in range(2, EPOCHS + 1):
        assert resumed(data_bin, epoch, 0, rebuild_batches=True) == whole[epoch]
