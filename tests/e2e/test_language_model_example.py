"""examples/language_model/run.py end to end on tiny slices of real text, so the script cannot rot:
`words` (sentencepiece, fairseq-preprocess --only-source, ls and native fairseq-train, eval-lm on
test, the perplexity table) on a few hundred lines of the standard library's own source, and `bytes`
(the byte corpus split by path hash, train, eval-lm on valid with a context window, bits per byte) on
a few of its files, with a 1-layer, width-32 model for 3 updates on CPU. One split is scored in each
(--eval-subsets) to keep the number of fairseq start-ups down; `bytes --sp` (2 more processes) is not
run here (examples/language_model/README.md has its measured run). Marked `e2e`."""
import gzip
import json
import math
import os
import subprocess
import sys
import sysconfig

import pytest

from support import ROOT

pytestmark = pytest.mark.e2e

SCRIPT = os.path.join(ROOT, "examples", "language_model", "run.py")
STDLIB = sysconfig.get_paths()["stdlib"]
TINY = ["--layers", "1", "--dim", "32", "--heads", "2", "--warmup", "2", "--log-interval", "1"]  # 3 updates


def run_script(*args, cwd):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    r = subprocess.run([sys.executable, SCRIPT, *args], cwd=cwd, capture_output=True, text=True, timeout=300, env=env)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    return out


def text_lines(n):
    """n lines of English-ish real text: the comment lines of the standard library's argparse.py."""
    with open(os.path.join(STDLIB, "argparse.py"), encoding="utf-8") as f:
        lines = [line.strip().lstrip("#").strip() for line in f]
    lines = [line for line in lines if len(line.split()) >= 3]
    assert len(lines) >= n
    return lines[:n]


def test_words(tmp_path):
    lines = text_lines(400)
    data = tmp_path / "corpus"
    data.mkdir()
    # the names a Multi30k checkout has: train.en, val.en.gz, test_2016_flickr.en
    (data / "train.en").write_text("\n".join(lines[:340]) + "\n")
    with gzip.open(data / "val.en.gz", "wt") as f:
        f.write("\n".join(lines[340:370]) + "\n")
    (data / "test_2016_flickr.en").write_text("\n".join(lines[370:]) + "\n")
    out = run_script("words", str(data), "work", "--seeds", "1", "--max-update", "3", "--vocab-size", "200",
                     "--max-tokens", "256", "--eval-subsets", "test", *TINY, cwd=str(tmp_path))
    results = json.load(open(tmp_path / "work" / "results.json"))
    assert [(r["side"], r["seed"]) for r in results["runs"]] == [("ls", 1), ("native", 1)]
    assert results["corpus"]["valid"]["sentences"] == 30 and results["corpus"]["test"]["sentences"] == 30
    for r in results["runs"]:
        assert "valid" not in r and 1 < r["test"]["ppl"] < 1000 and r["test"]["word_ppl"] > r["test"]["ppl"], r
    assert math.isfinite(results["summary"]["test_ppl"]["rel_diff"])
    assert "test perplexity per piece" in out and "rel. diff" in out, out[-3000:]


def test_bytes(tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    # 40 small modules of the standard library; a site-packages directory is left out
    names = sorted(f for f in os.listdir(STDLIB) if f.endswith(".py")
                   and os.path.getsize(os.path.join(STDLIB, f)) < 20000)[:40]
    for name in names:
        (source / name).write_bytes(open(os.path.join(STDLIB, name), "rb").read())
    (source / "site-packages").mkdir()
    (source / "site-packages" / "x.py").write_text("not part of the corpus\n")
    out = run_script("bytes", "work", "--source", str(source), "--max-update", "3", "--tokens-per-sample", "64",
                     "--max-tokens", "256", "--valid-percent", "30", "--test-percent", "30",
                     "--eval-subsets", "valid", *TINY,
                     cwd=str(tmp_path))
    results = json.load(open(tmp_path / "work" / "results.json"))
    corpus = results["corpus"]
    assert sum(s["files"] for s in corpus.values()) == len(names)
    assert all(s["files"] > 0 for s in corpus.values()), corpus
    (run,) = results["runs"]
    assert [u for u, _, _ in run["train_losses"]] == [1, 2, 3]
    # about log2(dictionary size) = 6.7 bits per byte after 3 updates
    assert 1 < run["valid"]["bits_per_byte"] < 10 and "test" not in run, run
    assert "bits per byte" in out
