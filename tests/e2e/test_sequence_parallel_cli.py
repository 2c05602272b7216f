"""Sequence parallelism through fairseq-train itself, on CPU ranks over gloo (legacy_ddp,
--distributed-no-spawn), against the single-process runs, for translation (ls_transformer) and the
language model (ls_transformer_lm, --tokens-per-sample blocks) where marked [both]:

* [both] one SGD update with --sequence-parallel-size 2 moves every parameter as one process does, in
  both modes (the LM: ulysses), with all dropouts at 0.1 (a mask that differs in 2% of its elements
  already gives errors near 1e-1 here: the masks must be the single-process ones);
* 8 ls_adam updates: SP 2 (under torchrun) logs the 1-process losses, SP 2 x DP 2 (4 ranks) the
  2-rank DP losses [both], with the same words and sentences per batch; the loss falls; the SP
  checkpoint decodes with fairseq-generate; the LM: SP 2 stopped after 4 updates and resumed to 8
  logs the 1-process losses, and fairseq-eval-lm gives its checkpoint the 1-process checkpoint's loss;
* refused combinations exit non-zero with a message naming the option [both]. Marked `e2e`."""
import functools
import os
import sys

import pytest
import torch

from support.cli import (BIN, by_hand, checkpoint_params, eval_lm, falls, free_port, generate, lm_train_args,
                         make_data_bin, make_lm_data_bin, run, train_args)
from support.recipe import train_inner

pytestmark = pytest.mark.e2e

DROPOUTS = ["--dropout", "0.1", "--attention-dropout", "0.1", "--activation-dropout", "0.1"]
SAVE = ["--no-epoch-checkpoints", "--no-save-optimizer-state"]


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return make_data_bin(str(tmp_path_factory.mktemp("sp_data")))


@pytest.fixture(scope="module")
def lm_data_bin(tmp_path_factory):
    return make_lm_data_bin(str(tmp_path_factory.mktemp("sp_lm_data")))


# The language model's runs: blocks of 15 tokens (not a multiple of P), or whole lines (--sample-break-mode
# eos: right-padded blocks of different lengths).
LM_BLOCKS = {"none": ["--tokens-per-sample", "15", "--sample-break-mode", "none"],
             "eos": ["--tokens-per-sample", "16", "--sample-break-mode", "eos"]}


@pytest.fixture(params=["translation", "lm"])
def family(request, data_bin, lm_data_bin):
    """(name, the fairseq-train arguments of a run: (save dir, updates, *extra) -> list)."""
    if request.param == "translation":
        return "translation", lambda d, updates, *extra: _args(data_bin, d, updates, *extra)
    return "lm", lambda d, updates, *extra: _lm_args(lm_data_bin, d, updates, *extra)


def _args(data_bin, d, updates, *extra):
    return [*train_args(data_bin, d, updates), *DROPOUTS, *SAVE, *extra]


def _lm_args(data_bin, d, updates, *extra, blocks="eos", save=SAVE):
    return [*lm_train_args(data_bin, d, updates), *LM_BLOCKS[blocks], *DROPOUTS, *save, *extra]


def _sgd(args_of, d, world, *extra):
    """One SGD update (lr 1, no momentum) with the arguments args_of(d, updates, *extra); returns the
    parameters after it."""
    args = args_of(d, 1, "--optimizer", "sgd", "--lr", "1.0", "--momentum", "0", *extra)
    if world == 1:
        run(["fairseq-train", *args], cwd=str(d))
    else:
        by_hand(args, world, d)
    return checkpoint_params(d)


def test_one_sgd_update_moves_parameters_as_one_process(family, tmp_path):
    name, args_of = family
    dirs = {name: tmp_path / name for name in ("start", "one", "ulysses", "allgather")}
    for d in dirs.values():
        d.mkdir()
    start = _sgd(args_of, dirs["start"], 1, "--lr", "0")  # the initial parameters (same seed)
    one = _sgd(args_of, dirs["one"], 1)
    moved = {k: (one[k] - start[k]).abs().max().item() for k in one}
    # every parameter but the attention's key biases (no gradient in exact arithmetic) moves
    assert all(m > 1e-4 for k, m in moved.items() if not k.endswith("k_proj.bias")), moved
    # the LM: ulysses only (its allgather runs in test_sp2_dp2_logs_the_dp2_losses, and both modes in
    # tests/fairseq/test_sequence_parallel.py), to keep the test short
    for mode in ("ulysses", "allgather") if name == "translation" else ("ulysses",):
        sp = _sgd(args_of, dirs[mode], 2, "--sequence-parallel-size", "2", "--sequence-parallel-mode", mode)
        errors = {k: (sp[k] - one[k]).abs().max().item() for k in one}
        print(f"{name} {mode}: max |SP 2 - 1 process| after one SGD update {max(errors.values()):.3g} "
              f"(largest update {max(moved.values()):.3g})")
        assert max(errors.values()) <= 1e-3, (mode, errors)


def _adam(data_bin, d, world, *extra, args_of=None, updates=8, logged=None):
    """ls_adam up to `updates` updates (args_of(d, updates, *extra) or the translation's arguments), of
    which `logged` (default all; fewer when resumed) run here; returns (per-update [(loss, wpb, bsz)]
    from rank 0's log, rank 0's log)."""
    args = (args_of or functools.partial(_args, data_bin))(d, updates, "--max-tokens", "200", *extra)
    if world == 1:
        _, log = run(["fairseq-train", *args], cwd=str(d))
    else:
        log = by_hand(args, world, d)[0][1]
    rows = [(float(r["loss"]), float(r["wpb"]), float(r["bsz"])) for r in train_inner(log)]
    assert len(rows) == (logged or updates), log[-3000:]
    return rows, log


def _same_run(sp, reference):
    assert [r[1:] for r in sp] == [r[1:] for r in reference], (sp, reference)  # wpb, bsz
    torch.testing.assert_close(torch.tensor([r[0] for r in sp]), torch.tensor([r[0] for r in reference]),
                               rtol=0, atol=2e-3)
    assert falls([r[0] for r in sp], by=0.3), sp


@pytest.fixture(scope="module")
def one_process(data_bin, tmp_path_factory):
    """8 ls_adam updates in one process: (per-update rows, its save directory)."""
    d = tmp_path_factory.mktemp("one")
    return _adam(data_bin, d, 1)[0], d


def test_sp2_under_torchrun_logs_the_one_process_losses_and_decodes(data_bin, tmp_path, one_process):
    """SP 2 started by torchrun: its environment gives the world size (fairseq learns it after parsing
    the arguments); the hand launch of SP ranks runs in the other tests of this file."""
    one, one_dir = one_process
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()), os.path.join(BIN, "fairseq-train"),
           *_args(data_bin, tmp_path, 8, "--max-tokens", "200"), "--distributed-backend", "gloo",
           "--ddp-backend", "legacy_ddp", "--sequence-parallel-size", "2"]
    _, log = run(cmd, cwd=str(tmp_path))
    sp = [(float(r["loss"]), float(r["wpb"]), float(r["bsz"])) for r in train_inner(log)]
    assert len(sp) == 8, log[-3000:]
    _same_run(sp, one)
    # fairseq-generate (one process, no torch.distributed) runs the SP checkpoint unsharded: the
    # hypotheses are the 1-process checkpoint's
    corpus = os.path.dirname(data_bin)
    _, out, hyps = generate(corpus, str(tmp_path / "checkpoint_last.pt"))
    _, _, reference = generate(corpus, str(one_dir / "checkpoint_last.pt"))
    assert hyps and {k: h for k, (_, h) in hyps.items()} == {k: h for k, (_, h) in reference.items()}, out[-3000:]


def test_sp2_dp2_logs_the_dp2_losses(family, tmp_path):
    _, args_of = family
    (tmp_path / "dp").mkdir()
    (tmp_path / "spdp").mkdir()
    dp, _ = _adam(None, tmp_path / "dp", 2, args_of=args_of)
    spdp, log = _adam(None, tmp_path / "spdp", 4, "--sequence-parallel-size", "2", "--sequence-parallel-mode",
                      "allgather", args_of=args_of)
    _same_run(spdp, dp)


def test_lm_sp2_resumes_with_the_one_process_losses_and_eval_lm(lm_data_bin, tmp_path):
    """--sample-break-mode none, blocks of 15 tokens, ulysses: 4 updates, then a second fairseq-train
    resumes from checkpoint_last.pt (optimizer state and the data iterator's place) to 8; the losses
    are the uninterrupted 1-process run's, and fairseq-eval-lm (one process) scores both checkpoints
    alike."""
    args_of = functools.partial(_lm_args, lm_data_bin, blocks="none", save=["--no-epoch-checkpoints"])
    for name in ("one", "sp"):
        (tmp_path / name).mkdir()
    one, _ = _adam(None, tmp_path / "one", 1, args_of=args_of)
    sp2 = ["--sequence-parallel-size", "2"]
    first, _ = _adam(None, tmp_path / "sp", 2, *sp2, args_of=args_of, updates=4)
    second, log = _adam(None, tmp_path / "sp", 2, *sp2, args_of=args_of, updates=8, logged=4)
    assert "Loaded checkpoint" in log and "@ 4 updates" in log, log[-3000:]
    _same_run(first + second, one)
    ours, out = eval_lm(lm_data_bin, str(tmp_path / "sp" / "checkpoint_last.pt"), str(tmp_path),
                        *LM_BLOCKS["none"])
    reference, _ = eval_lm(lm_data_bin, str(tmp_path / "one" / "checkpoint_last.pt"), str(tmp_path),
                           *LM_BLOCKS["none"])
    print(f"fairseq-eval-lm base-2 loss: SP 2 checkpoint {ours}, 1-process checkpoint {reference}")
    assert abs(ours - reference) <= 2e-3, out[-3000:]


@pytest.mark.parametrize("world,extra,message", [
    (1, ["--sequence-parallel-size", "2"],
     "--sequence-parallel-size 2 must divide the number of processes (--distributed-world-size 1)"),
    # 2 heads, not divisible by 3: the size is refused for the world first (allgather would not run either)
    (1, ["--sequence-parallel-size", "3"],
     "--sequence-parallel-size 3 must divide the number of processes (--distributed-world-size 1)"),
    (2, ["--sequence-parallel-size", "2", "--criterion", "label_smoothed_cross_entropy"],
     "does not support --criterion"),
], ids=["world", "world_first", "criterion"])
def test_refused_at_build(data_bin, tmp_path, world, extra, message):
    """The run's processes (one, or 2 ranks started by hand over gloo) each refuse when they build the model.
    (Every refusal's message, the heads of either stack included: tests/fairseq/test_sequence_parallel_options.py.)"""
    args = _args(data_bin, tmp_path, 1, *extra)
    results = [run(["fairseq-train", *args], cwd=str(tmp_path), check=False)] if world == 1 else \
        by_hand(args, world, tmp_path, check=False)
    for rc, log in results:
        assert rc != 0 and message in log, log[-3000:]
