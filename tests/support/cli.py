"""fairseq's real command line on a tiny corpus, for the e2e tests of bf16, checkpoints and distributed
training: console scripts of the running venv (fairseq-train, fairseq-generate, ...), a toy data-bin
(the target is the source in upper case) and a 1-layer, width-32 model."""
import json
import os
import random
import re
import subprocess
import sys

from support import ROOT

BIN = os.path.dirname(sys.executable)  # the venv's console scripts
USER_DIR = os.path.join(ROOT, "fairseq_lightseq")
TINY_MODEL = ["--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "32",
              "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
              "--encoder-attention-heads", "2", "--decoder-attention-heads", "2", "--share-all-embeddings"]
LS_STACK = ["--arch", "ls_transformer", "--optimizer", "ls_adam", "--criterion", "ls_label_smoothed_cross_entropy"]
NATIVE_STACK = ["--arch", "transformer", "--optimizer", "adam", "--criterion", "label_smoothed_cross_entropy"]


def env(**extra):
    """One thread per process (2 shared cores), no warnings noise, none of torch's variables that
    switch the safe loader off or on; `extra` added."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_FORCE_")}
    return dict(e, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", **extra)


def run(cmd, cwd, timeout=300, check=True, **extra_env):
    """Runs `cmd` (a console script name from BIN, or a full command); returns (returncode, stdout+stderr)."""
    if not os.path.isabs(cmd[0]) and os.path.exists(os.path.join(BIN, cmd[0])):
        cmd = [os.path.join(BIN, cmd[0]), *cmd[1:]]
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env(**extra_env))
    out = r.stdout + r.stderr
    if check:
        assert r.returncode == 0, f"{' '.join(cmd)} failed ({r.returncode}):\n{out[-4000:]}"
    return r.returncode, out


def make_data_bin(d, n_train=200, n_valid=16, n_test=12):
    """Writes a toy parallel corpus into directory `d` and binarises it into d/bin (joined dictionary,
    train/valid/test); returns the data-bin path."""
    rng = random.Random(0)
    words = [f"w{i}" for i in range(16)]
    for split, n in (("train", n_train), ("valid", n_valid), ("test", n_test)):
        with open(os.path.join(d, f"{split}.src"), "w") as fs, open(os.path.join(d, f"{split}.tgt"), "w") as ft:
            for _ in range(n):
                s = rng.choices(words, k=rng.randint(3, 8))
                fs.write(" ".join(s) + "\n")
                ft.write(" ".join(w.upper() for w in s) + "\n")
    run(["fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt", "--trainpref", "train",
         "--validpref", "valid", "--testpref", "test", "--destdir", "bin", "--joined-dictionary", "--workers", "1"],
        cwd=d)
    return os.path.join(d, "bin")


def train_args(data_bin, save_dir, updates, stack=LS_STACK, dropout=0.0, max_tokens=400, cpu=True):
    """fairseq-train arguments: tiny model, lr 0.005, label smoothing 0.1, json log every update, CPU
    (or the visible GPU with cpu=False)."""
    return [data_bin, "--user-dir", USER_DIR, *stack, *TINY_MODEL, "--dropout", str(dropout), "--lr", "0.005",
            "--label-smoothing", "0.1", "--max-tokens", str(max_tokens), "--max-update", str(updates),
            "--seed", "1", "--num-workers", "0", "--save-dir", str(save_dir), "--log-format", "json",
            "--log-interval", "1"] + (["--cpu"] if cpu else [])


def train_inner(log):
    """fairseq's per-update json records (--log-format json --log-interval 1): [{num_updates, loss, ...}]."""
    return [json.loads(m) for m in re.findall(r"\| train_inner \| (\{.*\})", log)]


def losses(log):
    return [float(r["loss"]) for r in train_inner(log)]


def falls(xs, by=0.5):
    """The mean of the last two values is at least `by` below the mean of the first two."""
    return sum(xs[-2:]) / 2 < sum(xs[:2]) / 2 - by
