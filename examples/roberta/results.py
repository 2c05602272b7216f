"""The numbers of run.sh's logs, and their comparison over seeds.

    python results.py OUT_DIR                       # one run: pretraining valid loss, classifier accuracy
    python results.py --compare LS_DIR... -- NATIVE_DIR...   # mean, std and per-seed differences

Pretraining: the masked-LM validation loss (base 2, over the masked tokens) of the last validation;
fine-tuning: fairseq-validate's accuracy and loss (base 2, per sentence) on the valid and test splits of
checkpoint_last.pt.
"""
import json
import os
import re
import statistics
import sys


def _json_rows(path, tag):
    rows = []
    with open(path) as f:
        for line in f:
            if f"| {tag} |" in line and "{" in line:
                rows.append(json.loads(line[line.index("{"):]))
    return rows


def results(out):
    valid = _json_rows(os.path.join(out, "pretrain", "train.log"), "valid")
    finetune = {}
    with open(os.path.join(out, "finetune", "validate.log")) as f:
        for line in f:
            m = re.search(r"valid on '(valid|test)' subset \| loss ([\d.]+) .*?accuracy ([\d.]+)", line)
            if m:
                finetune[f"finetune_{m.group(1)}_loss"] = float(m.group(2))
                finetune[f"finetune_{m.group(1)}_accuracy"] = float(m.group(3))
    return {"pretrain_valid_loss": float(valid[-1]["valid_loss"]), "pretrain_updates": int(valid[-1]["valid_num_updates"]),
            **finetune}


def compare(ls_dirs, native_dirs):
    ls, native = [results(d) for d in ls_dirs], [results(d) for d in native_dirs]
    for key in ("pretrain_valid_loss", "finetune_valid_accuracy", "finetune_test_accuracy", "finetune_valid_loss",
                "finetune_test_loss"):
        a, b = [r[key] for r in ls], [r[key] for r in native]
        sd = (lambda xs: statistics.stdev(xs) if len(xs) > 1 else 0.0)
        print(f"{key}: ls {statistics.mean(a):.4f} +- {sd(a):.4f} {a} | native {statistics.mean(b):.4f} +- "
              f"{sd(b):.4f} {b} | mean difference {statistics.mean(a) - statistics.mean(b):+.4f}")


if __name__ == "__main__":
    if sys.argv[1] == "--compare":
        i = sys.argv.index("--")
        compare(sys.argv[2:i], sys.argv[i + 1:])
    else:
        print(json.dumps(results(sys.argv[1])))
