"""End to end through fairseq's real command line: preprocess a tiny parallel corpus, train
ls_transformer_tiny for 30 updates on CPU, decode with fairseq-generate (the checkpoint is read by
torch's safe loader), score with sacrebleu, and decode the checkpoint converted to fairseq's
transformer_tiny. Marked `e2e` (select or skip with -m)."""
import os
import random
import re
import subprocess
import sys

import pytest
import sacrebleu

pytestmark = pytest.mark.e2e

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.dirname(sys.executable)  # the venv's console scripts (fairseq-train, ...)
USER_DIR = os.path.join(ROOT, "fairseq_lightseq")


def run(cmd, cwd):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, f"{' '.join(cmd)} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r.stdout + r.stderr


def write_corpus(d):
    """A learnable toy task: the target is the source in upper case."""
    rng = random.Random(0)
    words = [f"w{i}" for i in range(16)]
    for split, n in (("train", 300), ("valid", 20), ("test", 24)):
        with open(os.path.join(d, f"{split}.src"), "w") as fs, open(os.path.join(d, f"{split}.tgt"), "w") as ft:
            for _ in range(n):
                s = rng.choices(words, k=rng.randint(3, 8))
                fs.write(" ".join(s) + "\n")
                ft.write(" ".join(w.upper() for w in s) + "\n")


def generate(d, path, extra=()):
    out = run([f"{BIN}/fairseq-generate", "bin", "--path", path, "--gen-subset", "test", "--beam", "2",
               "--batch-size", "32", "--cpu", "--user-dir", USER_DIR, *extra], d)
    hyps = {}
    for line in out.splitlines():
        m = re.match(r"^H-(\d+)\t\S+\t(.*)$", line)
        if m:
            hyps[int(m.group(1))] = m.group(2)
    return hyps


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("e2e"))
    write_corpus(d)
    run([f"{BIN}/fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt", "--trainpref", "train",
         "--validpref", "valid", "--testpref", "test", "--destdir", "bin", "--joined-dictionary",
         "--workers", "1"], d)
    log = run([f"{BIN}/fairseq-train", "bin", "--user-dir", USER_DIR, "--arch", "ls_transformer_tiny",
               "--encoder-embed-dim", "32", "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
               "--decoder-ffn-embed-dim", "64", "--share-all-embeddings", "--dropout", "0.1",
               "--optimizer", "adam", "--lr", "0.01", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "5",
               "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
               "--max-tokens", "500", "--max-update", "30", "--cpu", "--seed", "1", "--num-workers", "0",
               "--save-dir", "ckpt", "--no-epoch-checkpoints", "--disable-validation",
               "--log-format", "simple", "--log-interval", "1"], d)
    losses = [float(x) for x in re.findall(r"train_inner \|.*? loss=([\d.]+)", log)]
    return d, losses


@pytest.fixture(scope="module")
def hypotheses(trained):
    """fairseq-generate on the ls_transformer checkpoint (run once for the tests below)."""
    return generate(trained[0], "ckpt/checkpoint_last.pt")


def test_training_loss_decreases(trained):
    _, losses = trained
    assert len(losses) >= 25, losses
    first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    print(f"train loss: first 3 updates {first:.3f}, last 3 {last:.3f}")
    assert last < first - 0.3, (first, last)


def test_generate_and_sacrebleu(trained, hypotheses):
    d, _ = trained
    hyps = hypotheses
    with open(os.path.join(d, "test.tgt")) as f:
        refs = [line.strip() for line in f]
    assert len(hyps) == len(refs)
    bleu = sacrebleu.corpus_bleu([hyps[i] for i in range(len(refs))], [refs])
    assert 0.0 <= bleu.score <= 100.0
    print(f"BLEU after 30 updates: {bleu.score:.2f}")


def test_converted_checkpoint_decodes_identically_with_fairseq_transformer(trained, hypotheses):
    d, _ = trained
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import convert_checkpoint
    convert_checkpoint.main([os.path.join(d, "ckpt/checkpoint_last.pt"), os.path.join(d, "fs.pt"), "--to", "fairseq"])
    # --user-dir only for the safe-loader allowlist: the model built is fairseq's transformer_tiny
    assert generate(d, "fs.pt") == hypotheses
