"""fairseq's command line on a tiny corpus, for the e2e tests that probe it as a user would.

The corpus is the one of the CLI defect reports: sentence pairs over a three-word vocabulary
(`z x y z y`), target = source, preprocessed with a joined dictionary. The model is 1 layer of width
32, so a run costs about the command's start-up time.
"""
import os
import random
import re
import subprocess
import sys

from support import ROOT
from support.recipe import train_inner

BIN = os.path.dirname(sys.executable)  # the venv's console scripts (fairseq-train, ...)
USER_DIR = os.path.join(ROOT, "fairseq_lightseq")
CONVERT = os.path.join(ROOT, "scripts", "convert_checkpoint.py")

TINY = ["--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
        "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2",
        "--decoder-attention-heads", "2", "--share-all-embeddings", "--cpu", "--num-workers", "0"]
# The three implementations fairseq_lightseq registers, and fairseq's own.
LS = ["--arch", "ls_transformer", "--criterion", "ls_label_smoothed_cross_entropy", "--optimizer", "ls_adam"]
NATIVE = ["--arch", "transformer", "--criterion", "label_smoothed_cross_entropy", "--optimizer", "adam"]


def write_corpus(d: str, n_train: int = 300, n_valid: int = 20, n_test: int = 40, seed: int = 0) -> None:
    """{train,valid,test}.{src,tgt} in d: 3 to 8 words from {x, y, z}, target = source."""
    rng = random.Random(seed)
    for split, n in (("train", n_train), ("valid", n_valid), ("test", n_test)):
        with open(os.path.join(d, f"{split}.src"), "w") as fs, open(os.path.join(d, f"{split}.tgt"), "w") as ft:
            for _ in range(n):
                line = " ".join(rng.choices("xyz", k=rng.randint(3, 8))) + "\n"
                fs.write(line)
                ft.write(line)


def run(cmd, cwd, check=True, timeout=300):
    """Runs a command (OMP_NUM_THREADS=1, warnings off); returns (returncode, stdout + stderr)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    out = r.stdout + r.stderr
    if check:
        assert r.returncode == 0, f"{' '.join(cmd)} failed ({r.returncode}):\n{out[-4000:]}"
    return r.returncode, out


def make_corpus(d: str, **sizes) -> str:
    """Writes the corpus into d and preprocesses it into d/bin; returns d."""
    write_corpus(d, **sizes)
    run([f"{BIN}/fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt", "--trainpref", "train",
         "--validpref", "valid", "--testpref", "test", "--destdir", "bin", "--joined-dictionary",
         "--workers", "1"], d)
    return d


def train(d: str, *args, check=True, user_dir=True):
    """fairseq-train bin TINY args (with --user-dir fairseq_lightseq); returns (returncode, log)."""
    extra = ["--user-dir", USER_DIR] if user_dir else []
    return run([f"{BIN}/fairseq-train", "bin", *extra, *TINY, *args], d, check=check)


def generate(d: str, path: str, *args, check=True):
    """fairseq-generate bin --path path (test subset, beam 2, with --user-dir);
    returns (returncode, log, {sentence id: (score, hypothesis)})."""
    rc, out = run([f"{BIN}/fairseq-generate", "bin", "--path", path, "--gen-subset", "test", "--beam", "2",
                   "--batch-size", "64", "--cpu", "--user-dir", USER_DIR, *args], d, check=check)
    hyps = {}
    for line in out.splitlines():
        m = re.match(r"^H-(\d+)\t(\S+)\t(.*)$", line)
        if m:
            hyps[int(m.group(1))] = (float(m.group(2)), m.group(3))
    return rc, out, hyps


def convert(src: str, dst: str, to: str, cwd: str):
    """scripts/convert_checkpoint.py src dst --to {fairseq, lightseq}."""
    return run([sys.executable, CONVERT, src, dst, "--to", to], cwd)


_CORPUS = {}


def corpus_once(tmp_path_factory) -> str:
    """The default corpus (300/20/40 pairs), preprocessed once per session for every e2e module that
    uses it (a fixture imported into several modules would run once per module)."""
    if "d" not in _CORPUS:
        _CORPUS["d"] = make_corpus(str(tmp_path_factory.mktemp("cli_corpus")))
    return _CORPUS["d"]


def per_update(log):
    """[(num_updates, loss, nll_loss, lr)] from --log-format json --log-interval 1 output."""
    return [(int(r["num_updates"]), float(r["loss"]), float(r["nll_loss"]), float(r["lr"])) for r in train_inner(log)]
