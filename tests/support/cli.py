"""fairseq's real command line on tiny corpora, for the e2e tests: the running venv's console scripts
(fairseq-train, fairseq-generate, ...; with the plugin, run in the test process by `run`), two toy
data-bins and a 1-layer, width-32 model, so a run costs well under a second of training.

* `make_data_bin`: 16 words, target = the source in upper case (bf16, checkpoints, distributed runs);
* `make_corpus` / `corpus_once`: the corpus of the CLI defect reports, sentence pairs over a
  three-word vocabulary (`z x y z y`), target = source.
Both are preprocessed with a joined dictionary.
* `make_lm_data_bin` / `lm_train_args`: the language model's: a monolingual text preprocessed
  --only-source; a 1-layer, width-32 ls_transformer_lm.
"""
import os
import random
import re
import socket
import subprocess
import sys

from support import ROOT, inprocess, rank_server
from support.recipe import train_inner

BIN = os.path.dirname(sys.executable)  # the venv's console scripts
USER_DIR = os.path.join(ROOT, "fairseq_lightseq")
CONVERT = os.path.join(ROOT, "scripts", "convert_checkpoint.py")

TINY_MODEL = ["--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "32",
              "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
              "--encoder-attention-heads", "2", "--decoder-attention-heads", "2", "--share-all-embeddings"]
TINY = TINY_MODEL + ["--cpu", "--num-workers", "0"]
# The three implementations fairseq_lightseq registers, and fairseq's own.
LS = ["--arch", "ls_transformer", "--criterion", "ls_label_smoothed_cross_entropy", "--optimizer", "ls_adam"]
NATIVE = ["--arch", "transformer", "--criterion", "label_smoothed_cross_entropy", "--optimizer", "adam"]


def env(**extra):
    """One thread per process (2 shared cores), no warnings noise, none of torch's variables that
    switch the safe loader off or on; `extra` added."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_FORCE_")}
    return dict(e, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", **extra)


def run(cmd, cwd, check=True, timeout=300, process=False, **extra_env):
    """Runs `cmd` (a console script name from BIN, or a full command); returns (returncode, stdout+stderr).

    A fairseq tool given --user-dir fairseq_lightseq (or fairseq-preprocess, which the plugin leaves
    alone), or one of the scripts that import the plugin, runs inside this process
    (support.inprocess: the same entry point and parser, no start-up); anything else, or any command
    with `process` (where the process itself is tested: its exit, a run without the plugin), runs as
    a subprocess with `timeout`."""
    tool = inprocess.entry_point(cmd)
    if not process and tool and (tool[0] in (None, "fairseq_cli.preprocess") or "--user-dir" in cmd):
        rc, out = inprocess.call(cmd, cwd, **extra_env)
    else:
        if not os.path.isabs(cmd[0]) and os.path.exists(os.path.join(BIN, cmd[0])):
            cmd = [os.path.join(BIN, cmd[0]), *cmd[1:]]
        r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env(**extra_env))
        rc, out = r.returncode, r.stdout + r.stderr
    if check:
        assert rc == 0, f"{' '.join(cmd)} failed ({rc}):\n{out[-4000:]}"
    return rc, out


def _write_pairs(d, sizes, sentence):
    """{train,valid,test}.{src,tgt} in d, n pairs per split; sentence(rng) -> (source, target)."""
    rng = random.Random(0)
    for split, n in sizes:
        with open(os.path.join(d, f"{split}.src"), "w") as fs, open(os.path.join(d, f"{split}.tgt"), "w") as ft:
            for _ in range(n):
                s, t = sentence(rng)
                fs.write(s + "\n")
                ft.write(t + "\n")


def _preprocess(d):
    run(["fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt", "--trainpref", "train",
         "--validpref", "valid", "--testpref", "test", "--destdir", "bin", "--joined-dictionary", "--workers", "1"],
        cwd=d)
    return os.path.join(d, "bin")


def make_data_bin(d, n_train=200, n_valid=16, n_test=12):
    """A toy corpus over 16 words (target = source in upper case) binarised into d/bin; returns d/bin."""
    words = [f"w{i}" for i in range(16)]

    def sentence(rng):
        s = rng.choices(words, k=rng.randint(3, 8))
        return " ".join(s), " ".join(w.upper() for w in s)

    _write_pairs(d, (("train", n_train), ("valid", n_valid), ("test", n_test)), sentence)
    return _preprocess(d)


def make_corpus(d: str, n_train: int = 300, n_valid: int = 20, n_test: int = 40) -> str:
    """The three-word corpus (3 to 8 words from {x, y, z}, target = source) preprocessed into d/bin; returns d."""
    def sentence(rng):
        s = " ".join(rng.choices("xyz", k=rng.randint(3, 8)))
        return s, s

    _write_pairs(d, (("train", n_train), ("valid", n_valid), ("test", n_test)), sentence)
    _preprocess(d)
    return d


_CORPUS = {}


def corpus_once(tmp_path_factory) -> str:
    """The default three-word corpus, preprocessed once per session for every e2e module that uses it
    (a fixture imported into several modules would run once per module)."""
    if "d" not in _CORPUS:
        _CORPUS["d"] = make_corpus(str(tmp_path_factory.mktemp("cli_corpus")))
    return _CORPUS["d"]


def train_args(data_bin, save_dir, updates, stack=LS, dropout=0.0, max_tokens=400, cpu=True):
    """fairseq-train arguments: tiny model, lr 0.005, label smoothing 0.1, json log every update, CPU
    (or the visible GPU with cpu=False)."""
    return [data_bin, "--user-dir", USER_DIR, *stack, *TINY_MODEL, "--dropout", str(dropout), "--lr", "0.005",
            "--label-smoothing", "0.1", "--max-tokens", str(max_tokens), "--max-update", str(updates),
            "--seed", "1", "--num-workers", "0", "--save-dir", str(save_dir), "--log-format", "json",
            "--log-interval", "1"] + (["--cpu"] if cpu else [])


LM_MODEL = ["--decoder-layers", "1", "--decoder-embed-dim", "32", "--decoder-ffn-embed-dim", "64",
            "--decoder-attention-heads", "2", "--share-decoder-input-output-embed"]
LM = ["--task", "language_modeling", "--arch", "ls_transformer_lm", "--criterion", "ls_cross_entropy",
      "--optimizer", "ls_adam"]


def lm_train_args(data_bin, save_dir, updates, tokens_per_sample=16, break_mode="none", max_tokens=64):
    """fairseq-train arguments of the tiny ls_transformer_lm on `make_lm_data_bin`'s data: blocks of
    `tokens_per_sample` tokens (--sample-break-mode `break_mode`), lr 0.005, json log every update, CPU."""
    return [data_bin, "--user-dir", USER_DIR, *LM, *LM_MODEL, "--tokens-per-sample", str(tokens_per_sample),
            "--sample-break-mode", break_mode, "--lr", "0.005", "--max-tokens", str(max_tokens),
            "--max-update", str(updates), "--seed", "1", "--num-workers", "0", "--save-dir", str(save_dir),
            "--log-format", "json", "--log-interval", "1", "--cpu"]


def eval_lm(data_bin: str, path: str, cwd: str, *args):
    """fairseq-eval-lm data_bin --path path (valid subset, CPU, with --user-dir); returns (base-2 loss per
    token, log)."""
    _, out = run(["fairseq-eval-lm", data_bin, "--path", path, "--gen-subset", "valid", "--cpu", "--user-dir",
                  USER_DIR, "--num-workers", "0", *args], cwd)
    m = re.search(r"Loss \(base 2\): ([0-9.]+)", out)
    assert m, out[-3000:]
    return float(m.group(1)), out


def train(d: str, *args, check=True, user_dir=True, process=False):
    """fairseq-train bin TINY args in corpus directory d (with --user-dir fairseq_lightseq; in a
    subprocess with `process`, see `run`); returns (returncode, log)."""
    extra = ["--user-dir", USER_DIR] if user_dir else []
    return run(["fairseq-train", "bin", *extra, *TINY, *args], d, check=check, process=process)


def generate(d: str, path: str, *args, check=True, user_dir=True, process=False, **extra_env):
    """fairseq-generate bin --path path (test subset, beam 2, with --user-dir unless not `user_dir`,
    `extra_env` added to the environment; in a subprocess with `process`, see `run`); returns
    (returncode, log, {sentence id: (score, hypothesis)}). The batches are read in the decoding process
    (--num-workers 0, as the training runs here read theirs) unless `process` or `args` say otherwise:
    the hypotheses do not depend on it, and a loader worker costs seconds at its shutdown."""
    extra = ["--user-dir", USER_DIR] if user_dir else []
    if not process and "--num-workers" not in args:
        extra += ["--num-workers", "0"]
    rc, out = run(["fairseq-generate", "bin", "--path", path, "--gen-subset", "test", "--beam", "2",
                   "--batch-size", "64", "--cpu", *extra, *args], d, check=check, process=process, **extra_env)
    hyps = {}
    for line in out.splitlines():
        m = re.match(r"^H-(\d+)\t(\S+)\t(.*)$", line)
        if m:
            hyps[int(m.group(1))] = (float(m.group(2)), m.group(3))
    return rc, out, hyps


def convert(src: str, dst: str, to: str, cwd: str):
    """scripts/convert_checkpoint.py src dst --to {fairseq, lightseq}."""
    return run([sys.executable, CONVERT, src, dst, "--to", to], cwd)


def losses(log):
    return [float(r["loss"]) for r in train_inner(log)]


def falls(xs, by=0.5):
    """The mean of the last two values is at least `by` below the mean of the first two."""
    return sum(xs[-2:]) / 2 < sum(xs[:2]) / 2 - by


def per_update(log):
    """[(num_updates, loss, nll_loss, lr)] from --log-format json --log-interval 1 output."""
    return [(int(r["num_updates"]), float(r["loss"]), float(r["nll_loss"]), float(r["lr"])) for r in train_inner(log)]


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_ranks(cmds, cwd, check=True, timeout=300):
    """Runs the commands concurrently (one per rank); returns [(returncode, log)] (each must exit 0 when
    `check`). fairseq-train ranks are forked by support.rank_server (their own processes, without
    each paying fairseq's import); other commands are started as they are."""
    train = os.path.join(BIN, "fairseq-train")
    if all(c[0] == train for c in cmds):
        results = rank_server.run([["fairseq-train", *c[1:]] for c in cmds], cwd, timeout, env())
    else:
        procs = [subprocess.Popen(c, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  env=env()) for c in cmds]
        logs = []
        try:
            for p in procs:
                logs.append(p.communicate(timeout=timeout)[0])
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        results = [(p.returncode, log) for p, log in zip(procs, logs)]
    if check:
        for rc, log in results:
            assert rc == 0, log[-4000:]
    return results


def by_hand(args, world: int, cwd, check=True, ddp_backend="legacy_ddp"):
    """fairseq-train `args` on `world` CPU ranks over gloo, started as SLURM or a hand launch would
    (--distributed-init-method tcp://..., --distributed-rank r, --distributed-no-spawn); returns
    [(returncode, log)] per rank."""
    common = [os.path.join(BIN, "fairseq-train"), *args, "--distributed-world-size", str(world),
              "--distributed-backend", "gloo", "--distributed-init-method", f"tcp://127.0.0.1:{free_port()}",
              "--distributed-no-spawn", "--ddp-backend", ddp_backend]
    return run_ranks([[*common, "--distributed-rank", str(r)] for r in range(world)], str(cwd), check=check)


def checkpoint_params(d):
    """The parameters in d/checkpoint_last.pt as float64 (not the float buffers fairseq stores: version,
    _float_tensor)."""
    import torch

    state = torch.load(os.path.join(d, "checkpoint_last.pt"), map_location="cpu", weights_only=False)["model"]
    return {k: v.double() for k, v in state.items() if v.is_floating_point() and not k.endswith(("version", "_float_tensor"))}


def differing_parameters(a, b):
    """The names of the parameters that are not bit for bit equal in a/checkpoint_last.pt and b/checkpoint_last.pt."""
    x, y = checkpoint_params(a), checkpoint_params(b)
    assert x.keys() == y.keys()
    return [k for k in x if not x[k].equal(y[k])]


def _toy_sentence(rng):
    words = "cat dog sat ran on under mat log big small red old".split()
    return " ".join([rng.choice(["the", "a"])] + rng.choices(words, k=rng.randint(2, 11)))


def make_lm_data_bin(d, n_train=300, n_valid=20, n_test=20, sentence=_toy_sentence):
    """A toy monolingual corpus (by default 3 to 12 words over 12, a determiner first; else sentence(rng)
    -> str) binarised with fairseq-preprocess --only-source into d/bin, as the language_modeling task reads
    it; returns d/bin."""
    rng = random.Random(0)
    for split, n in (("train", n_train), ("valid", n_valid), ("test", n_test)):
        with open(os.path.join(d, f"{split}.txt"), "w") as f:
            for _ in range(n):
                f.write(sentence(rng) + "\n")
    run(["fairseq-preprocess", "--only-source", "--trainpref", "train.txt", "--validpref", "valid.txt",
         "--testpref", "test.txt", "--destdir", "bin", "--workers", "1"], cwd=d)
    return os.path.join(d, "bin")
