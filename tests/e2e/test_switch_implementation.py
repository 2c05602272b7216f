"""Switching implementations mid-training through the command line: 20 updates of fairseq's
transformer + label_smoothed_cross_entropy + adam, scripts/convert_checkpoint.py --to lightseq, then
20 updates of ls_transformer + ls_label_smoothed_cross_entropy + ls_adam with --restore-file (no
--reset-optimizer) log the per-update losses and lr of 40 uninterrupted native updates and end at
its parameters, within fp32 noise; converted back (--to fairseq), fairseq's adam continues it the
same way. Dropout is off: the two implementations draw different (both valid) dropout masks.
Batches of 4 sentences keep all 45 updates in epoch 1: fairseq orders the batches with the seed
`seed + epoch` of the epoch in which the run (or the resumed run) started, so a resume in a later
epoch continues with other batches even natively."""
import os

import pytest
import torch

from support.cli import LS, NATIVE, convert, corpus_once, per_update, train

pytestmark = pytest.mark.e2e

ARGS = ["--dropout", "0", "--label-smoothing", "0.1", "--lr", "2e-3", "--lr-scheduler", "inverse_sqrt",
        "--warmup-updates", "4", "--batch-size", "4", "--seed", "7", "--disable-validation", "--log-format", "json",
        "--log-interval", "1", "--no-epoch-checkpoints"]
LOG_TOL = 2e-3  # fairseq logs losses rounded to 3 decimals


def _params(path):
    return torch.load(path, map_location="cpu")["model"]


def _assert_params_close(ours, theirs):
    """fp32 noise: 1e-6. Except the attention key biases: their gradient is exactly zero in exact
    arithmetic (softmax ignores a constant added to every key's score), so Adam turns rounding noise
    into steps of up to lr in either implementation; they may differ by a few lr-sized steps."""
    assert ours.keys() == theirs.keys()
    for k in theirs:
        atol = 2e-4 if k.endswith("k_proj.bias") else 1e-6
        torch.testing.assert_close(ours[k], theirs[k], rtol=1e-5, atol=atol, msg=k)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = corpus_once(tmp_path_factory)
    # Reference: 45 native updates, with a checkpoint at update 40.
    _, ref = train(d, *NATIVE, *ARGS, "--max-update", "45", "--save-dir", "ref", "--save-interval-updates", "40")
    _, first = train(d, *NATIVE, *ARGS, "--max-update", "20", "--save-dir", "native20")
    convert("native20/checkpoint_last.pt", "to_ls.pt", "lightseq", d)
    _, second = train(d, *LS, *ARGS, "--max-update", "40", "--save-dir", "ls40", "--restore-file", "to_ls.pt")
    convert("ls40/checkpoint_last.pt", "to_native.pt", "fairseq", d)
    _, third = train(d, *NATIVE, *ARGS, "--max-update", "45", "--save-dir", "native45", "--restore-file", "to_native.pt")
    return d, per_update(ref), per_update(first), second, per_update(second), per_update(third)


def _close(ours, ref):
    assert [u for u, *_ in ours] == [u for u, *_ in ref]
    for (u, loss, nll, lr), (_, loss_r, nll_r, lr_r) in zip(ours, ref):
        assert lr == lr_r, (u, lr, lr_r)  # the lr schedule continues where it was
        assert abs(loss - loss_r) <= LOG_TOL and abs(nll - nll_r) <= LOG_TOL, (u, loss, loss_r, nll, nll_r)


def test_native_then_ls_matches_native(runs):
    d, ref, first, log, second, _ = runs
    assert "Loaded checkpoint to_ls.pt (epoch 1 @ 20 updates)" in log
    assert first == ref[:20]  # same implementation, same seed: identical
    assert [u for u, *_ in second] == list(range(21, 41))
    _close(second, ref[20:40])
    print("updates 21-40, ls vs native loss:", [(a[1], b[1]) for a, b in zip(second, ref[20:40])])
    ours = _params(os.path.join(d, "ls40", "checkpoint_last.pt"))
    [at40] = [f for f in os.listdir(os.path.join(d, "ref")) if f.endswith("_40.pt")]
    theirs = _params(os.path.join(d, "ref", at40))
    worst = max((ours[k] - theirs[k]).abs().max().item() for k in theirs if not k.endswith("k_proj.bias"))
    print(f"parameters after 40 updates, ls-continued vs native: max |difference| {worst:.2e} (key biases aside)")
    _assert_params_close(ours, theirs)


def test_ls_then_native_continues(runs):
    d, ref, *_, third = runs
    assert [u for u, *_ in third] == list(range(41, 46))
    _close(third, ref[40:45])
    ours = _params(os.path.join(d, "native45", "checkpoint_last.pt"))
    theirs = _params(os.path.join(d, "ref", "checkpoint_last.pt"))
    _assert_params_close(ours, theirs)
