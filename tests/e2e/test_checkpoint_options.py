"""Every checkpoint fairseq-train writes under the options users set loads with torch's safe loader
(weights_only, torch's default), by fairseq-validate, fairseq-generate and fairseq-train --restore-file,
with no environment variable. Four tiny runs combine the options (all with --eval-bleu
--best-checkpoint-metric bleu --maximize-best-checkpoint-metric and checkpoints every 2 updates):

* ls:   ls stack, --store-ema, --update-freq 2, --keep-best-checkpoints 2, --patience, reduce_lr_on_plateau;
* bf16: fairseq's transformer/adam, --bf16, inverse_sqrt;
* fp16: fairseq's transformer/adam, --fp16 (dynamic loss scaler; --fp16-no-flatten-grads: fairseq
  flattens fp16 grads only on CUDA), polynomial_decay. (ls_transformer's CPU kernels take no fp16:
  its --fp16 run is the GPU check's);
* amp:  ls stack, --amp (the CPU has no grad scaler), cosine.

plus checkpoint_best, checkpoint_last, checkpoint.best_bleu_*.pt and an average from
scripts/average_checkpoints.py. Marked `e2e`."""
import glob
import json
import os
import re
import sys

import pytest
import torch

from support import ROOT
from support.cli import LS, NATIVE, USER_DIR, make_data_bin, run, train_args
from support.recipe import train_inner

pytestmark = pytest.mark.e2e

BLEU = ["--eval-bleu", "--eval-bleu-args", '{"beam": 1, "max_len_a": 1, "max_len_b": 5}',
        "--best-checkpoint-metric", "bleu", "--maximize-best-checkpoint-metric",
        "--save-interval-updates", "2", "--validate-interval-updates", "2"]
RUNS = {
    "ls": (LS, 6, ["--store-ema", "--ema-decay", "0.9", "--ema-start-update", "1", "--update-freq", "2",
                         "--keep-best-checkpoints", "2", "--patience", "10", "--lr-scheduler", "reduce_lr_on_plateau",
                         "--keep-interval-updates", "4"]),
    "bf16": (NATIVE, 4, ["--bf16", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "2"]),
    "fp16": (NATIVE, 4, ["--fp16", "--fp16-no-flatten-grads", "--lr-scheduler", "polynomial_decay",
                               "--total-num-update", "10"]),
    "amp": (LS, 4, ["--amp", "--lr-scheduler", "cosine"]),
}
# What the runs' checkpoints hold beyond torch's own allowlist (numpy 1 writes numpy.core.*): the
# legacy `args`/`cfg.model` namespace and --eval-bleu's n-gram counts (numpy int64 arrays in the meters).
EXPECTED_GLOBALS = {"argparse.Namespace", "numpy._core.multiarray._reconstruct", "numpy.dtype", "numpy.ndarray"}


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return make_data_bin(str(tmp_path_factory.mktemp("ckpt_data")))


def args_of(name, data_bin, save_dir, updates=None):
    stack, n, extra = RUNS[name]
    return [*train_args(data_bin, save_dir, updates or n, stack=stack), *BLEU, *extra]


@pytest.fixture(scope="module")
def runs(data_bin, tmp_path_factory):
    """{name: save_dir} after each run; the ls run's last two epoch checkpoints averaged into avg2.pt."""
    out = {}
    for name in RUNS:
        save_dir = str(tmp_path_factory.mktemp(f"run_{name}"))
        run(["fairseq-train", *args_of(name, data_bin, save_dir)], cwd=save_dir)
        out[name] = save_dir
    run([sys.executable, os.path.join(ROOT, "scripts", "average_checkpoints.py"), "--inputs", out["ls"],
         "--num-epoch-checkpoints", "2", "--output", os.path.join(out["ls"], "avg2.pt")], cwd=out["ls"])
    return out


def test_runs_wrote_what_the_options_ask_for(runs):
    files = {name: sorted(os.path.basename(p) for p in glob.glob(os.path.join(d, "*.pt"))) for name, d in runs.items()}
    assert any(f.startswith("checkpoint.best_bleu_") for f in files["ls"]), files
    for name in runs:
        assert {"checkpoint_best.pt", "checkpoint_last.pt"} <= set(files[name]), files
    state = torch.load(os.path.join(runs["ls"], "checkpoint_last.pt"))
    assert "ema" in state["extra_state"] and "best" in state["extra_state"]
    assert "loss_scale" in torch.load(os.path.join(runs["fp16"], "checkpoint_last.pt"))["last_optimizer_state"]


def test_stored_globals_are_the_known_ones_and_load_weights_only(runs):
    """The globals torch does not allow by itself, listed by torch in a process without the plugin, are
    exactly the known ones; with the plugin imported each checkpoint loads with weights_only=True."""
    paths = sorted(p for d in runs.values() for p in glob.glob(os.path.join(d, "*.pt")))
    code = ("import json, sys, torch; print(json.dumps({p: torch.serialization.get_unsafe_globals_in_checkpoint(p)"
            " for p in sys.argv[1:]}))")
    _, out = run([sys.executable, "-c", code, *paths], cwd=ROOT)
    found = json.loads(out.strip().splitlines()[-1])
    union = {g.replace("numpy.core.", "numpy._core.") for gs in found.values() for g in gs}
    assert union == EXPECTED_GLOBALS, found
    import fairseq_lightseq  # noqa: F401

    for p in paths:
        state = torch.load(p, map_location="cpu", weights_only=True)
        assert state["model"] and state["optimizer_history"], p


def test_validate_and_generate_load_every_kind(runs, data_bin):
    """fairseq-validate on the ls run's best checkpoint; fairseq-generate with one ensemble of
    checkpoint_best/_last/.best_bleu_*/average of every run (both architectures)."""
    ls = runs["ls"]
    _, log = run(["fairseq-validate", data_bin, "--user-dir", USER_DIR, "--path", os.path.join(ls, "checkpoint_best.pt"),
                  "--cpu", "--num-workers", "0", "--max-tokens", "400", "--task", "translation"], cwd=ls)
    assert re.search(r"valid on 'valid' subset \| loss [\d.]+", log), log[-2000:]
    paths = [os.path.join(ls, "avg2.pt"), *glob.glob(os.path.join(ls, "checkpoint.best_bleu_*.pt"))]
    paths += [os.path.join(d, f) for d in runs.values() for f in ("checkpoint_best.pt", "checkpoint_last.pt")]
    _, log = run(["fairseq-generate", data_bin, "--user-dir", USER_DIR, "--path", ":".join(paths), "--cpu",
                  "--num-workers", "0", "--beam", "1", "--batch-size", "16", "--gen-subset", "test", "--max-len-a", "1", "--max-len-b", "5",
                  "--required-batch-size-multiple", "1"], cwd=ls)  # (fairseq-fixed drops a partial last batch)
    assert len(re.findall(r"^H-\d+\t", log, flags=re.M)) == 12, log[-2000:]


@pytest.mark.parametrize("name,ckpt", [("ls", "checkpoint.best_bleu_*.pt"), ("ls", "avg2.pt"),
                                       ("bf16", "checkpoint_last.pt"), ("fp16", "checkpoint_1_2.pt"),
                                       ("amp", "checkpoint_best.pt")])
def test_restore_file_resumes(runs, data_bin, tmp_path, name, ckpt):
    """fairseq-train --restore-file CKPT (same options, 2 more updates) resumes at CKPT's update."""
    path = sorted(glob.glob(os.path.join(runs[name], ckpt)))[-1]
    done = torch.load(path)["optimizer_history"][-1]["num_updates"]
    _, log = run(["fairseq-train", *args_of(name, data_bin, str(tmp_path), updates=done + 2),
                  "--restore-file", path], cwd=str(tmp_path))
    assert f"Loaded checkpoint {path}" in log, log[-3000:]
    updates = [int(r["num_updates"]) for r in train_inner(log)]
    assert updates == [done + 1, done + 2], updates
