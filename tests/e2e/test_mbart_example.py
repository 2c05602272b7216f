"""examples/mbart end to end on a tiny multi30k-shaped corpus, so the scripts cannot rot: prepare.py
(sentencepiece, the denoising and translation data-bins) -> run.sh (multilingual denoising pretraining,
translation_from_pretrained_bart fine-tuning, fairseq-generate, sacreBLEU; ls, and native fine-tuning only,
from that pretraining through PRETRAINED=FILE, the path of fairseq's own mbart.cc25) -> results.py --compare.
A 1-layer width-16 model, a few updates. Marked `e2e`."""
import json
import os
import sys

import pytest

from support import ROOT
from support.examples import run_example, write_multi30k

pytestmark = pytest.mark.e2e

EXAMPLE = os.path.join(ROOT, "examples", "mbart")


def test_prepare_run_and_compare(tmp_path):
    raw, data = tmp_path / "multi30k", tmp_path / "data"
    raw.mkdir()
    write_multi30k(str(raw))
    run_example([sys.executable, os.path.join(EXAMPLE, "prepare.py"), str(raw), str(data), "--vocab-size", "40"],
                str(tmp_path))
    for path in ("mono/dict.txt", "mono/en/train.bin", "mono/de/valid.bin", "pair/test.en-de.de.bin", "raw/test.de"):
        assert os.path.isfile(data / path), path
    tiny = dict(MODEL="--encoder-layers 1 --decoder-layers 1 --encoder-embed-dim 16 --decoder-embed-dim 16 "
                      "--encoder-ffn-embed-dim 32 --decoder-ffn-embed-dim 32 --encoder-attention-heads 2 "
                      "--decoder-attention-heads 2", PRETRAIN_UPDATES="4", FINETUNE_UPDATES="4")
    run_sh = os.path.join(EXAMPLE, "run.sh")
    pretrained = {"native": dict(PRETRAINED=str(tmp_path / "ls_1" / "pretrain" / "checkpoint_last.pt"))}
    for impl in ("ls", "native"):
        # the tiny corpus' 20 validation sentences make no validation batch of denoising blocks
        argv = [run_sh, impl, "1", str(data), str(tmp_path / f"{impl}_1"), "--disable-validation"]
        out = json.loads(run_example(argv, str(tmp_path), timeout=600, **tiny, **pretrained.get(impl, {})))
        assert 0 <= out["test_bleu"] <= 100, out
        assert os.path.getsize(tmp_path / f"{impl}_1" / "test.hyp") > 0
    assert not os.path.exists(tmp_path / "native_1" / "pretrain" / "checkpoint_last.pt")  # fine-tuned from ls's
    out = run_example([sys.executable, os.path.join(EXAMPLE, "results.py"), "--compare", str(tmp_path / "ls_1"),
                       "--", str(tmp_path / "native_1")], str(tmp_path))
    assert out.startswith("test_bleu: ls"), out
