"""examples/roberta end to end on a tiny multi30k-shaped corpus, so the scripts cannot rot:
prepare.py (sentencepiece, the masked-LM and en/de classification data-bins) -> run.sh (pretraining,
fine-tuning from it, fairseq-validate; ls, and native fine-tuning only, from that pretraining through
PRETRAINED=) -> results.py and its --compare. A 1-layer width-16 model, a few updates. Marked `e2e`."""
import gzip
import json
import os
import random
import subprocess
import sys

import pytest

from support import ROOT
from support.cli import env

pytestmark = pytest.mark.e2e

EXAMPLE = os.path.join(ROOT, "examples", "roberta")
WORDS = {"en": "the a dog cat runs sits on under red small".split(), "de": "der die hund katze läuft sitzt auf unter rot klein".split()}


def _write_multi30k(d):
    rng = random.Random(0)
    for name, n in (("train", 120), ("val", 20), ("test_2016_flickr", 20)):
        for lang, words in WORDS.items():
            with gzip.open(os.path.join(d, f"{name}.{lang}.gz"), "wt", encoding="utf-8") as f:
                f.writelines(" ".join(rng.choices(words, k=rng.randint(3, 8))) + "\n" for _ in range(n))


def _run(cmd, cwd, **extra):
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300,
                       env=env(PYTHON=sys.executable, **extra))
    assert r.returncode == 0, (cmd, r.stdout[-3000:], r.stderr[-3000:])
    return r.stdout


def test_prepare_run_and_compare(tmp_path):
    raw, data = tmp_path / "multi30k", tmp_path / "data"
    raw.mkdir()
    _write_multi30k(str(raw))
    _run([sys.executable, os.path.join(EXAMPLE, "prepare.py"), str(raw), str(data), "--vocab-size", "40",
          "--finetune-train", "100"], str(tmp_path))
    for path in ("mlm-bin/dict.txt", "mlm-bin/test.bin", "cls-bin/input0/valid.bin", "cls-bin/label/dict.txt"):
        assert os.path.isfile(data / path), path
    tiny = dict(MODEL="--encoder-layers 1 --encoder-embed-dim 16 --encoder-ffn-embed-dim 32 --encoder-attention-heads 2",
                PRETRAIN_UPDATES="4", FINETUNE_UPDATES="3")
    run_sh = os.path.join(EXAMPLE, "run.sh")
    ls = json.loads(_run([run_sh, "ls", "1", str(data), str(tmp_path / "ls_1")], str(tmp_path), **tiny))
    assert ls["pretrain_updates"] == 4 and 0 <= ls["finetune_test_accuracy"] <= 100, ls
    native = json.loads(_run([run_sh, "native", "1", str(data), str(tmp_path / "native_1")], str(tmp_path),
                             PRETRAINED=str(tmp_path / "ls_1"), **tiny))
    assert native["pretrain_valid_loss"] == ls["pretrain_valid_loss"]  # the same pretraining, fine-tuned natively
    out = _run([sys.executable, os.path.join(EXAMPLE, "results.py"), "--compare", str(tmp_path / "ls_1"), "--",
                str(tmp_path / "native_1")], str(tmp_path))
    assert out.startswith("pretrain_valid_loss: ls") and "finetune_test_accuracy" in out, out
