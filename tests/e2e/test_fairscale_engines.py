"""fairseq's engines from fairscale through the real command line, 2 CPU ranks over gloo.

- `--zero-sharding os` (ZeRO-1: fairscale's OSS holds each rank's share of the optimizer state): the ls
  model, criterion and `ls_adam` log the losses of fairseq's transformer, criterion and adam in bf16 with
  gradient clipping (where ls_adam must keep unscaling the gradients itself, which OSS would undo); a run
  resumed from its checkpoint (which holds the whole optimizer state: OSS gathers it on rank 0), with or
  without --zero-sharding os, ends with the parameters and optimizer state of the uninterrupted run, bit
  for bit.
- `--ddp-backend fully_sharded` (FSDP) runs only on CUDA: on the CPU it is refused with one line before
  fairseq-train reaches fairscale (patches/fairscale_engines.py), and so is sequence parallelism with it,
  and either engine without fairscale installed.
Marked `e2e`."""
import os
import sys

import pytest
import torch

from support.cli import LS, NATIVE, by_hand, corpus_once, losses, make_data_bin, train, train_args

pytestmark = pytest.mark.e2e

UPDATES = 6
ZERO1 = ["--zero-sharding", "os"]
BF16_CLIPPED = ["--bf16", "--clip-norm", "0.1"]  # every update clipped (the gradient norms are about 0.7)


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return make_data_bin(str(tmp_path_factory.mktemp("zero1_data")))


def zero1(data_bin, d, stack, *extra, updates=UPDATES):
    """Rank 0's log of a 2-rank legacy_ddp run with --zero-sharding os in d."""
    os.makedirs(d, exist_ok=True)
    (_, log), _ = by_hand([*train_args(data_bin, d, updates, stack=stack), *ZERO1, *extra], 2, d)
    return log


def checkpoint(d):
    return torch.load(os.path.join(d, "checkpoint_last.pt"), map_location="cpu", weights_only=False)


@pytest.fixture(scope="module")
def ls_run(data_bin, tmp_path_factory):
    """The directory of the uninterrupted ls run (fp32: bf16 resumes from the bf16 parameters, without the
    fp32 master copy)."""
    d = tmp_path_factory.mktemp("zero1_ls")
    zero1(data_bin, d, LS)
    return d


def test_zero1_ls_matches_native(data_bin, tmp_path):
    """In bf16 with every update clipped: fairseq's FP16Optimizer, then OSS around the ls_adam or adam update."""
    ours = losses(zero1(data_bin, tmp_path / "ls", LS, *BF16_CLIPPED))
    ref = losses(zero1(data_bin, tmp_path / "native", NATIVE, *BF16_CLIPPED))
    print("per-update loss under --zero-sharding os --bf16 --clip-norm 0.1, ls vs native:", list(zip(ours, ref)))
    assert len(ours) == UPDATES
    torch.testing.assert_close(torch.tensor(ours), torch.tensor(ref), rtol=0, atol=2e-3)


@pytest.mark.parametrize("resumed", [ZERO1, []], ids=["zero1", "plain"])
def test_zero1_resume_is_the_uninterrupted_run(data_bin, tmp_path, ls_run, resumed):
    """Stopped after update 1 (inside epoch 1), then to UPDATES: under --zero-sharding os each rank takes its
    share of the optimizer state that rank 0 gathered into the checkpoint; without it (an ordinary
    checkpoint) every rank takes the whole."""
    zero1(data_bin, tmp_path, LS, updates=1)
    (_, log), _ = by_hand([*train_args(data_bin, tmp_path, UPDATES), *resumed], 2, tmp_path)
    assert "Loaded checkpoint" in log and len(losses(log)) == UPDATES - 1, log[-3000:]
    ours, ref = checkpoint(tmp_path), checkpoint(ls_run)
    for k, v in ref["model"].items():
        assert torch.equal(ours["model"][k], v), k
    assert ours["last_optimizer_state"]["state"].keys() == ref["last_optimizer_state"]["state"].keys()
    for i, s in ref["last_optimizer_state"]["state"].items():
        for name in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(ours["last_optimizer_state"]["state"][i][name], s[name]), (i, name)


def refusal(d, *args):
    """The last line of an in-process `fairseq-train` (ls stack) that must exit 1."""
    rc, log = train(d, *LS, "--lr", "0.001", "--max-tokens", "2000", "--no-save", *args, check=False)
    assert rc == 1, log[-3000:]
    return log.strip().splitlines()[-1]


def test_fully_sharded_is_refused_on_the_cpu(tmp_path_factory):
    line = refusal(corpus_once(tmp_path_factory), "--ddp-backend", "fully_sharded")
    assert line.endswith("error: --ddp-backend fully_sharded needs CUDA: fairscale's FullyShardedDataParallel "
                         "does not run on the CPU; there, --zero-sharding os shards the optimizer state"), line


def test_refusals_come_before_fairseq_imports_fairscale(tmp_path_factory, monkeypatch):
    """Without fairscale, fairseq-train would end in fairseq's ImportError traceback."""
    d = corpus_once(tmp_path_factory)
    monkeypatch.setitem(sys.modules, "fairscale", None)  # `import fairscale` raises ImportError
    line = refusal(d, "--ddp-backend", "fully_sharded", "--sequence-parallel-size", "2")
    assert line.endswith("error: --sequence-parallel-size 2 does not support --ddp-backend fully_sharded"), line
    line = refusal(d, *ZERO1)
    assert line.endswith("error: --zero-sharding os needs the fairscale package: pip install fairscale==0.4.13 "
                         "(make setup installs it)"), line
