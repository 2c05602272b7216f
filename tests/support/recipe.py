"""Running the WMT14 recipe scripts (examples/wmt14_en_de) on a small prepared corpus: shared by
tests/e2e/test_recipe.py and tests/e2e/test_resume.py (a fixture imported in two modules would run twice,
so the prepared corpus is cached here, once per session)."""
import os
import re
import shlex
import subprocess
import sys

from support import ROOT, inprocess

RECIPE = os.path.join(ROOT, "examples", "wmt14_en_de")
N_TRAIN, N_VALID, N_TEST = 2000, 40, 30
# The recipe's transformer-big shrunk to 1 layer of width 32 (the arch defaults yield to explicit args).
TINY = ["--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
        "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2",
        "--decoder-attention-heads", "2", "--cpu", "--num-workers", "0", "--max-tokens", "1000",
        "--disable-validation", "--log-format", "json", "--log-interval", "1"]


def run(cmd, cwd, env=None, check=True):
    """Runs a recipe script with the venv's python; returns (returncode, stdout+stderr)."""
    full = dict(os.environ, PYTHON=sys.executable, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", WORKERS="1")
    full.update(env or {})
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300, env=full)
    out = r.stdout + r.stderr
    if check:
        assert r.returncode == 0, f"{' '.join(cmd)} failed ({r.returncode}):\n{out[-4000:]}"
    return r.returncode, out


def train(data, save_dir, *extra, variant="ls", check=True, env=None):
    """train.sh DATA SAVE_DIR VARIANT TINY... extra (environment `env` added); returns (returncode, log).

    The script composes the fairseq-train command and the command runs in this process
    (support.inprocess): run with PYTHON=true, train.sh execs `true` instead of python, and bash's trace
    of that `exec` line (the script runs it under `set -x`) is the command line, as the log shows it.
    Under TORCHRUN the script runs as it is: the launcher and its processes are the point."""
    cmd = [os.path.join(RECIPE, "train.sh"), os.path.join(data, "out", "data-bin"), save_dir, variant, *TINY, *extra]
    if "TORCHRUN" in (env or {}):
        return run(cmd, cwd=data, env=env, check=check)
    rc, trace = run(cmd, cwd=data, env=dict(env or {}, PYTHON="true"), check=False)
    execs = [line for line in trace.splitlines() if line.startswith("+ exec true ")]
    if rc == 0 and execs:
        rc, out = inprocess.call([sys.executable, *shlex.split(execs[-1])[3:]], data)
        trace += out
    if check:
        assert rc == 0, f"{' '.join(cmd)} failed ({rc}):\n{trace[-4000:]}"
    return rc, trace


def train_inner(log):
    """fairseq's per-update json records (--log-format json --log-interval 1): [{num_updates, loss, ...}]."""
    import json

    return [json.loads(m) for m in re.findall(r"\| train_inner \| (\{.*\})", log)]


_PREPARED = {}


def prepare_once(tmp_path_factory):
    """A directory with raw/ (the demo corpus) and out/ (prepare.sh's output), and the prepare.sh
    log; made once per session, also for test_resume.py (a fixture imported there would run twice)."""
    if "d" not in _PREPARED:
        from fairseq_lightseq.demo.corpus import write_corpus

        d = str(tmp_path_factory.mktemp("recipe"))
        write_corpus(os.path.join(d, "raw"), n_train=N_TRAIN, n_valid=N_VALID, n_test=N_TEST)
        _, log = run([os.path.join(RECIPE, "prepare.sh"), "raw", "out"], cwd=d, env={"VOCAB_SIZE": "300"})
        _PREPARED.update(d=d, log=log)
    return _PREPARED["d"], _PREPARED["log"]
