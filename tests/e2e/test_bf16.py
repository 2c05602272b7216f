"""`fairseq-train --bf16 --user-dir fairseq_lightseq` trains in bfloat16 on the CPU (fairseq 0.12 alone
turns --bf16 into --tpu and stops, torch_xla missing), for ls_transformer and for fairseq's own
transformer: 20 updates through fairseq-train's entry point (in this process), with a probe that
records the dtype of the parameters the Trainer holds at every update (tests/support/probe_train.py).
Marked `e2e`."""
import pytest
import torch

from support.cli import LS, NATIVE, USER_DIR, falls, losses, make_data_bin, run, train_args
from support.probe_train import probe

pytestmark = pytest.mark.e2e

UPDATES = 20
# clipping on: under --bf16 fairseq's FP16Optimizer must unscale the grads itself (see ls_adam)
BF16 = ["--bf16", "--clip-norm", "0.1", "--disable-validation", "--no-epoch-checkpoints"]


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return make_data_bin(str(tmp_path_factory.mktemp("bf16_data")))


def probe_train(data_bin, save_dir, stack, *extra, cpu=True):
    """fairseq-train (probed) for UPDATES updates; returns (log, per-update probe records)."""
    with probe() as seen:
        _, log = run(["fairseq-train", *train_args(data_bin, save_dir, UPDATES, stack=stack, cpu=cpu), *extra],
                     cwd=str(save_dir))
    return log, seen


@pytest.fixture(scope="module")
def ls_bf16(data_bin, tmp_path_factory):
    return probe_train(data_bin, tmp_path_factory.mktemp("ls_bf16"), LS, *BF16)


@pytest.mark.parametrize("stack", ["ls", "native"])
def test_bf16_trains_in_bfloat16_on_cpu(data_bin, tmp_path, ls_bf16, stack):
    log, probe = ls_bf16 if stack == "ls" else probe_train(data_bin, tmp_path, NATIVE, *BF16)
    assert "training in bfloat16 on CPU" in log, log[-3000:]
    assert len(probe) == UPDATES
    assert all(r == {"params": ["torch.bfloat16"], "device": "cpu"} for r in probe), probe
    xs = losses(log)
    assert len(xs) == UPDATES and all(x == x for x in xs), xs
    assert falls(xs), xs


@pytest.mark.cuda
def test_bf16_trains_in_bfloat16_on_cuda(data_bin, tmp_path):
    log, probe = probe_train(data_bin, tmp_path, LS, *BF16, cpu=False)
    assert "training in bfloat16 on CUDA" in log, log[-3000:]
    assert all(r == {"params": ["torch.bfloat16"], "device": "cuda"} for r in probe), probe
    xs = losses(log)
    assert len(xs) == UPDATES and falls(xs), xs


def test_ls_adam_under_bf16_clips_like_fairseq_adam(data_bin, tmp_path, ls_bf16):
    """Same model and data, --bf16 --clip-norm 0.1: ls_adam's trajectory is fairseq adam's up to bf16
    rounding. (Had ls_adam taken the clip factor as a step scale, FP16Optimizer's factor would compound
    over the updates and the updates would vanish.)"""
    stack = ["--arch", "ls_transformer", "--optimizer", "adam", "--criterion", "ls_label_smoothed_cross_entropy"]
    log, _ = probe_train(data_bin, tmp_path, stack, *BF16)
    ours, theirs = losses(ls_bf16[0]), losses(log)
    torch.testing.assert_close(torch.tensor(ours), torch.tensor(theirs), rtol=0, atol=0.05)


def test_bf16_with_tpu_is_left_to_fairseq(data_bin, tmp_path):
    """--tpu asked for: fairseq's own TPU path runs unchanged (here it stops: torch_xla is absent)."""
    rc, log = run(["fairseq-train", *train_args(data_bin, tmp_path, 2), "--bf16", "--tpu"], cwd=str(tmp_path),
                  check=False)
    assert rc != 0 and "'tpu': True" in log and "xla_device" in log, log[-3000:]
    assert "training in bfloat16" not in log


def test_bf16_without_plugin_is_fairseqs_tpu_path(data_bin, tmp_path):
    """The baseline this plugin fixes: fairseq's transformer with --bf16 and no --user-dir takes the TPU path."""
    args = [a for a in train_args(data_bin, tmp_path, 2, stack=NATIVE) if a != USER_DIR and a != "--user-dir"]
    rc, log = run(["fairseq-train", *args, "--bf16"], cwd=str(tmp_path), check=False)
    assert rc != 0 and "'tpu': True" in log and "xla_device" in log, log[-3000:]
