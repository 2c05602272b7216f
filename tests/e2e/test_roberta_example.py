"""examples/roberta end to end on a tiny multi30k-shaped corpus, so the scripts cannot rot:
prepare.py (sentencepiece, the masked-LM and en/de classification data-bins) -> run.sh (pretraining,
fine-tuning from it, fairseq-validate; ls, and native fine-tuning only, from that pretraining through
PRETRAINED=) -> results.py and its --compare. A 1-layer width-16 model, a few updates. Marked `e2e`."""
import json
import os
import sys

import pytest

from support import ROOT
from support.examples import run_example, write_multi30k

pytestmark = pytest.mark.e2e

EXAMPLE = os.path.join(ROOT, "examples", "roberta")


def test_prepare_run_and_compare(tmp_path):
    raw, data = tmp_path / "multi30k", tmp_path / "data"
    raw.mkdir()
    write_multi30k(str(raw))
    run_example([sys.executable, os.path.join(EXAMPLE, "prepare.py"), str(raw), str(data), "--vocab-size", "40",
                 "--finetune-train", "100"], str(tmp_path))
    for path in ("mlm-bin/dict.txt", "mlm-bin/test.bin", "cls-bin/input0/valid.bin", "cls-bin/label/dict.txt"):
        assert os.path.isfile(data / path), path
    tiny = dict(MODEL="--encoder-layers 1 --encoder-embed-dim 16 --encoder-ffn-embed-dim 32 --encoder-attention-heads 2",
                PRETRAIN_UPDATES="4", FINETUNE_UPDATES="3")
    run_sh = os.path.join(EXAMPLE, "run.sh")
    ls = json.loads(run_example([run_sh, "ls", "1", str(data), str(tmp_path / "ls_1")], str(tmp_path), **tiny))
    assert ls["pretrain_updates"] == 4 and 0 <= ls["finetune_test_accuracy"] <= 100, ls
    native = json.loads(run_example([run_sh, "native", "1", str(data), str(tmp_path / "native_1")], str(tmp_path),
                                    PRETRAINED=str(tmp_path / "ls_1"), **tiny))
    assert native["pretrain_valid_loss"] == ls["pretrain_valid_loss"]  # the same pretraining, fine-tuned natively
    out = run_example([sys.executable, os.path.join(EXAMPLE, "results.py"), "--compare", str(tmp_path / "ls_1"),
                       "--", str(tmp_path / "native_1")], str(tmp_path))
    assert out.startswith("pretrain_valid_loss: ls") and "finetune_test_accuracy" in out, out
