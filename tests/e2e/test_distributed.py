"""fairseq's own distributed data parallel training with the plugin, on the CPU over gloo, through the
real command line: every DDP backend fairseq offers for this model (legacy_ddp, no_c10d, pytorch_ddp),
two ranks started as SLURM or a hand launch would (--distributed-init-method tcp://...,
--distributed-rank, --distributed-no-spawn), and a `torchrun --nproc_per_node 2` launch.

2 ranks x --max-tokens 400 draw the same batches per update as 1 process with --update-freq 2 (fairseq
hands out the batches round-robin), so the logged losses must match up to float summation order: without
dropout, and with every dropout on (each batch draws the seed of its place in the update whatever the split,
patches/batch_seeds.py). Marked `e2e`."""
import os
import shutil
import sys

import pytest
import torch

from support.cli import BIN, by_hand, differing_parameters, falls, free_port, losses, make_data_bin, run, train_args

pytestmark = pytest.mark.e2e

UPDATES = 6


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return make_data_bin(str(tmp_path_factory.mktemp("ddp_data")))


# every dropout of the model, for the runs with dropout
DROPOUTS = ["--dropout", "0.1", "--attention-dropout", "0.1", "--activation-dropout", "0.1"]


def update_freq_2(data_bin, d, cpu=True, extra=()):
    """1 process, --update-freq 2: the losses the 2-rank runs must reproduce."""
    _, log = run(["fairseq-train", *train_args(data_bin, d, UPDATES, cpu=cpu), *extra, "--update-freq", "2"],
                 cwd=str(d))
    xs = losses(log)
    assert len(xs) == UPDATES and falls(xs), xs
    return xs


@pytest.fixture(scope="module")
def one_process(data_bin, tmp_path_factory):
    return update_freq_2(data_bin, tmp_path_factory.mktemp("single"))


def check_matches(log, one_process):
    xs = losses(log)
    assert len(xs) == UPDATES, log[-3000:]
    torch.testing.assert_close(torch.tensor(xs), torch.tensor(one_process), rtol=0, atol=2e-3)


def ranks_by_hand(data_bin, d, ddp_backend, cpu=True, extra=()):
    """2 ranks started as SLURM or a hand launch would, over gloo; returns rank 0's log."""
    (_, log0), (_, log1) = by_hand([*train_args(data_bin, d, UPDATES, cpu=cpu), *extra], 2, d,
                                   ddp_backend=ddp_backend)
    assert "distributed init (rank 1)" in log1 and f"'ddp_backend': '{ddp_backend}'" in log0
    return log0


@pytest.fixture(scope="module")
def legacy_ddp(data_bin, tmp_path_factory):
    """(rank 0's log, save dir) of 2 legacy_ddp ranks to UPDATES updates: the run that matches --update-freq 2
    and the uninterrupted run a resumed one must end as (it keeps its checkpoint of update 3)."""
    d = tmp_path_factory.mktemp("legacy_ddp")
    return ranks_by_hand(data_bin, d, "legacy_ddp", extra=["--save-interval-updates", "3"]), d


@pytest.fixture(scope="module")
def one_process_with_dropout(data_bin, tmp_path_factory):
    return update_freq_2(data_bin, tmp_path_factory.mktemp("single_dropout"), extra=DROPOUTS)


# legacy_ddp without dropout (its run is also the uninterrupted one of test_two_ranks_resume; pytorch_ddp
# without dropout: test_torchrun_two_cpu_processes); the other two with every dropout 0.1: rank 1's batch
# draws the masks of the single process's second micro-batch, and a backend that split, reduced or ordered
# the batches otherwise misses the reference with dropout as it would without
@pytest.mark.parametrize("ddp_backend,dropout", [("legacy_ddp", False), ("no_c10d", True), ("pytorch_ddp", True)])
def test_two_ranks_match_update_freq_2(data_bin, tmp_path, ddp_backend, dropout, request):
    if ddp_backend == "legacy_ddp":
        log = request.getfixturevalue("legacy_ddp")[0]
    else:
        log = ranks_by_hand(data_bin, tmp_path, ddp_backend, extra=DROPOUTS if dropout else ())
    check_matches(log, request.getfixturevalue("one_process_with_dropout" if dropout else "one_process"))


@pytest.mark.cuda
def test_pytorch_ddp_on_cuda_two_ranks_one_gpu(data_bin, tmp_path):
    """fairseq's GPU path of pytorch_ddp (device_ids=[0] kept): two ranks share the GPU over gloo."""
    (tmp_path / "single").mkdir()
    reference = update_freq_2(data_bin, tmp_path / "single", cpu=False)
    check_matches(ranks_by_hand(data_bin, tmp_path, "pytorch_ddp", cpu=False), reference)


def test_torchrun_two_cpu_processes(data_bin, tmp_path, one_process):
    """torchrun starts both ranks (as on each machine of a multi-node run); fairseq reads its environment."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()), os.path.join(BIN, "fairseq-train"), *train_args(data_bin, tmp_path, UPDATES),
           "--distributed-backend", "gloo", "--ddp-backend", "pytorch_ddp"]
    _, log = run(cmd, cwd=str(tmp_path))
    assert "distributed init (rank 1): env://" in log and "distributed init (rank 0): env://" in log, log[-3000:]
    check_matches(log, one_process)


def test_two_ranks_resume(data_bin, tmp_path, legacy_ddp):
    """Resuming a 2-rank run from the uninterrupted run's checkpoint in the middle of epoch 2 (update 3, 2
    updates an epoch), as a run stopped there leaves it: rank 0 loads the checkpoint and broadcasts it, the
    other rank unpickles it with torch's safe loader (fairseq's _TensorPlaceholder must be allowed); the
    resumed run ends with the uninterrupted run's parameters, bit for bit (both ranks train on the batches the
    uninterrupted ranks train on: patches/resume_batches.py)."""
    _, whole = legacy_ddp
    shutil.copy(whole / "checkpoint_2_3.pt", tmp_path / "checkpoint_last.pt")
    (_, log0), _ = by_hand(train_args(data_bin, tmp_path, UPDATES), 2, tmp_path)
    assert "(epoch 2 @ 3 updates)" in log0, log0[-3000:]
    assert differing_parameters(whole, tmp_path) == []
