"""A run resumed from a checkpoint of epoch 2 or later ends with the uninterrupted run's parameters, bit for bit
(fairseq's command line, tiny models, CPU, every dropout on), from a mid-epoch checkpoint, an end-of-epoch one,
or the last checkpoint of a run killed with kill -9:

* translation (ls_transformer), 1 process: the uninterrupted run's checkpoint from the middle of epoch 2
  (--save-interval-updates) and from the end of epoch 2 (checkpoint2.pt), as a run stopped there by --max-update
  or --max-epoch leaves it;
* BART denoising (ls_bart_base, examples shuffled: --shuffle-instance), 1 process killed with kill -9 in epoch
  2, and 2 ranks (gloo) from the end of epoch 2; translation on 2 ranks is tests/e2e/test_distributed.py's.

Both runs reach the same final update under the same learning rate (fairseq's fixed schedule: --max-update
only says where a run stops). Without patches/resume_batches.py the resumed run trains on other batches in
every epoch after the first; without patches/denoising_noise.py BART noises its first batch after the resume
otherwise (--data-buffer-size 0, which makes BART runs repeatable at all: docs/usage.md). Marked `e2e`."""
import os
import re
import shutil
import signal
import subprocess
import threading

import pytest

from support.bart import mbart_data_once
from support.cli import BIN, TINY_MODEL, USER_DIR, by_hand, differing_parameters, env, make_data_bin, run, train_args

pytestmark = pytest.mark.e2e

DROPOUTS = ["--dropout", "0.1", "--attention-dropout", "0.1", "--activation-dropout", "0.1"]
UPDATES = 10  # translation, 1 process: 4 updates an epoch, so the runs end in epoch 3
BART_UPDATES = 20  # BART, 1 process: 9 updates an epoch


def loaded(log):
    """(epoch, updates) of the checkpoint a run resumed from."""
    m = re.search(r"Loaded checkpoint \S+ \(epoch (\d+) @ (\d+) updates\)", log)
    assert m, log[-3000:]
    return int(m.group(1)), int(m.group(2))


@pytest.fixture(scope="module")
def translation(tmp_path_factory):
    """(data-bin, save dir of the uninterrupted run, which keeps its checkpoints of update 6 and epoch 2)."""
    data_bin = make_data_bin(str(tmp_path_factory.mktemp("resume_epochs")))
    d = str(tmp_path_factory.mktemp("translation_whole"))
    run(["fairseq-train", *train_args(data_bin, d, UPDATES), *DROPOUTS, "--save-interval-updates", "6"], cwd=d)
    return data_bin, d


@pytest.mark.parametrize("checkpoint, resumed_at", [("checkpoint_2_6.pt", (2, 6)), ("checkpoint2.pt", (3, 8))],
                         ids=["mid-epoch", "end-of-epoch"])
def test_translation_resumed_in_a_later_epoch_ends_as_the_uninterrupted_run(translation, tmp_path, checkpoint,
                                                                            resumed_at):
    data_bin, whole = translation
    shutil.copy(os.path.join(whole, checkpoint), tmp_path / "checkpoint_last.pt")
    _, log = run(["fairseq-train", *train_args(data_bin, tmp_path, UPDATES), *DROPOUTS], cwd=tmp_path)
    assert loaded(log) == resumed_at
    assert differing_parameters(whole, tmp_path) == []


def bart_args(data, save_dir, updates):
    """Denoising on the English side of support.bart's data-bin (BART's noise: spans of Poisson(3.5) words
    masked, 10% random tokens), tiny ls_bart_base, constant lr, batches built in the training thread."""
    return [data["en"], "--user-dir", USER_DIR, "--task", "denoising", "--arch", "ls_bart_base", *TINY_MODEL,
            *DROPOUTS, "--max-source-positions", "128", "--max-target-positions", "128", "--tokens-per-sample", "64",
            "--mask", "0.3", "--mask-random", "0.1", "--mask-length", "span-poisson", "--poisson-lambda", "3.5",
            "--replace-length", "1", "--shuffle-instance", "1", "--criterion", "ls_label_smoothed_cross_entropy",
            "--label-smoothing", "0.1", "--optimizer", "ls_adam", "--lr", "0.003", "--max-tokens", "512",
            "--max-update", str(updates), "--seed", "1", "--cpu", "--num-workers", "0", "--data-buffer-size", "0",
            "--disable-validation", "--save-dir", str(save_dir)]


@pytest.fixture(scope="module")
def bart_data(tmp_path_factory):
    return mbart_data_once(tmp_path_factory)


def killed_in_epoch_2(argv, cwd, timeout=300):
    """Runs fairseq-train `argv` in its own process and kills it (SIGKILL) as soon as it has saved a checkpoint
    of epoch 2."""
    p = subprocess.Popen([os.path.join(BIN, "fairseq-train"), *argv], cwd=cwd, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, env=env())
    timer = threading.Timer(timeout, p.kill)  # a run that hangs or never reaches epoch 2 ends the test
    timer.start()
    try:
        out = []
        for line in p.stdout:
            out.append(line)
            if re.search(r"Saved checkpoint .*\(epoch 2 @", line):
                os.kill(p.pid, signal.SIGKILL)
                break
        assert p.wait() == -signal.SIGKILL, "".join(out)[-3000:]
    finally:
        timer.cancel()
        if p.poll() is None:
            p.kill()
            p.wait()


def test_bart_killed_in_epoch_2_resumes_to_the_uninterrupted_runs_parameters(bart_data, tmp_path):
    (tmp_path / "whole").mkdir()
    run(["fairseq-train", *bart_args(bart_data, tmp_path / "whole", BART_UPDATES)], cwd=tmp_path)
    # the killed run would go on for long (the constant lr does not depend on --max-update)
    killed_in_epoch_2([*bart_args(bart_data, tmp_path, 1000), "--save-interval-updates", "3"], tmp_path)
    _, log = run(["fairseq-train", *bart_args(bart_data, tmp_path, BART_UPDATES)], cwd=tmp_path)
    epoch, updates = loaded(log)
    assert epoch >= 2 and updates < BART_UPDATES
    assert differing_parameters(tmp_path / "whole", tmp_path) == []


def test_bart_on_two_ranks_resumed_in_epoch_3_ends_as_the_uninterrupted_run(bart_data, tmp_path):
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    for d in (whole, resumed):
        d.mkdir()
    by_hand(bart_args(bart_data, whole, 12), 2, tmp_path)
    shutil.copy(whole / "checkpoint2.pt", resumed / "checkpoint_last.pt")
    (_, log), _ = by_hand(bart_args(bart_data, resumed, 12), 2, tmp_path)
    assert loaded(log)[0] == 3
    assert differing_parameters(whole, resumed) == []
