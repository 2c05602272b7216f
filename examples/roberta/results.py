"""The numbers of run.sh's logs, and their comparison over seeds.

    python results.py OUT_DIR                       # one run: pretraining valid loss, classifier accuracy
    python results.py --compare LS_DIR... -- NATIVE_DIR...   # mean, std and per-seed differences

Pretraining: the masked-LM validation loss (base 2, over the masked tokens) of the last validation;
fine-tuning: fairseq-validate's accuracy and loss (base 2, per sentence) on the valid and test splits of
checkpoint_last.pt.
"""
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "common"))
from parity import json_rows, main  # noqa: E402


def results(out):
    valid = json_rows(os.path.join(out, "pretrain", "train.log"), "valid")
    finetune = {}
    with open(os.path.join(out, "finetune", "validate.log")) as f:
        for line in f:
            m = re.search(r"valid on '(valid|test)' subset \| loss ([\d.]+) .*?accuracy ([\d.]+)", line)
            if m:
                finetune[f"finetune_{m.group(1)}_loss"] = float(m.group(2))
                finetune[f"finetune_{m.group(1)}_accuracy"] = float(m.group(3))
    return {"pretrain_valid_loss": float(valid[-1]["valid_loss"]), "pretrain_updates": int(valid[-1]["valid_num_updates"]),
            **finetune}


if __name__ == "__main__":
    main(results, ("pretrain_valid_loss", "finetune_valid_accuracy", "finetune_test_accuracy", "finetune_valid_loss",
                   "finetune_test_loss"))
