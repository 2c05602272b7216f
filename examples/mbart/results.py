"""The numbers of run.sh's logs, and their comparison over seeds.

    python results.py OUT_DIR REFERENCE                          # one run
    python results.py --compare LS_DIR... -- NATIVE_DIR...      # mean, std and the mean difference

Pretraining and fine-tuning: the validation loss (base 2, label-smoothed, per target token) of the last
validation (None for a run with --disable-validation); the test split: sacreBLEU of OUT_DIR/test.hyp
(fairseq-generate's detokenized translations, in sentence order) against REFERENCE (prepare.py's
raw/test.de), also written to OUT_DIR/bleu.txt.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "common"))
from parity import json_rows, main  # noqa: E402


def _last_valid(path):
    rows = json_rows(path, "valid")
    return rows[-1] if rows else None


def results(out, reference=None):
    pretrain = _last_valid(os.path.join(out, "pretrain", "train.log")) \
        if os.path.exists(os.path.join(out, "pretrain", "train.log")) else None
    finetune = _last_valid(os.path.join(out, "finetune", "train.log"))
    bleu_file = os.path.join(out, "bleu.txt")
    if reference is not None:
        import sacrebleu

        with open(os.path.join(out, "test.hyp"), encoding="utf-8") as f:
            hyps = [line.rstrip("\n") for line in f]
        with open(reference, encoding="utf-8") as f:
            refs = [line.rstrip("\n") for line in f]
        with open(bleu_file, "w") as f:
            f.write(f"{sacrebleu.corpus_bleu(hyps, [refs]).score:.2f}\n")
    with open(bleu_file) as f:
        bleu = float(f.read())
    return {"pretrain_valid_loss": float(pretrain["valid_loss"]) if pretrain else None,
            "finetune_valid_loss": float(finetune["valid_loss"]) if finetune else None, "test_bleu": bleu}


if __name__ == "__main__":
    main(results, ("pretrain_valid_loss", "finetune_valid_loss", "test_bleu"))
