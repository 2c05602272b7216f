"""Packed against padded training, update for update: how far the numbers of an --ls-packed True run are from
the --ls-packed False run's with the same seed, for each activation.

    python -m scripts.packed_parity --multi30k DIR --json out.json      # 4000 pairs, 300 updates, relu and gelu
    python -m scripts.packed_parity --multi30k DIR --updates 50 --activations gelu

Method: the first --pairs sentence pairs of Multi30k En-De (train.en.gz / train.de.gz, split into words and
punctuation as bench_support/multi30k.py does), one joined dictionary, fairseq-preprocess into a temporary
data-bin. Then for each --activations value, fairseq-train of ls_transformer, 2+2 layers at width 64 (FFN 128,
4 heads, shared embeddings), every dropout 0.1 (--dropout, --attention-dropout, --activation-dropout),
--max-tokens 1024, --seed 1, ls_label_smoothed_cross_entropy 0.1, ls_adam at a constant lr 5e-4, one thread,
--max-update --updates, twice: --ls-packed False, then True, each its own process, one at a time.

Reported per activation: how many of the logged losses (fairseq's json log, 3 decimals) differ, the largest
difference and the first update that differs; the largest difference of the final parameters
(checkpoint_last.pt) and the parameter holding it, also without the attention key biases (whose gradient is
zero in exact arithmetic, so that Adam turns rounding noise into steps of either run).
"""
import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile

from fairseq_lightseq.checkpoints.io import load_file
from scripts.bench_support import multi30k
from scripts.bench_support.provenance import record

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = ["--arch", "ls_transformer", "--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "64",
         "--decoder-embed-dim", "64", "--encoder-ffn-embed-dim", "128", "--decoder-ffn-embed-dim", "128",
         "--encoder-attention-heads", "4", "--decoder-attention-heads", "4", "--share-all-embeddings",
         "--dropout", "0.1", "--attention-dropout", "0.1", "--activation-dropout", "0.1"]
TRAINING = ["--criterion", "ls_label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--optimizer", "ls_adam",
            "--adam-betas", "(0.9, 0.98)", "--lr", "5e-4", "--max-tokens", "1024", "--seed", "1", "--cpu",
            "--num-workers", "0", "--disable-validation", "--no-epoch-checkpoints", "--save-interval", "1000",
            "--log-format", "json", "--log-interval", "1"]


def data_bin(corpus: str, pairs: int, work: str) -> str:
    """The first `pairs` pairs of the corpus, tokenized and preprocessed (joined dictionary) into work/bin."""
    for lang in ("en", "de"):
        with gzip.open(os.path.join(corpus, f"train.{lang}.gz"), "rt", encoding="utf-8") as f, \
                open(os.path.join(work, f"train.{lang}"), "w", encoding="utf-8") as g:
            for _, line in zip(range(pairs), f):
                g.write(" ".join(multi30k.TOKEN.findall(line)) + "\n")
    out = os.path.join(work, "bin")
    multi30k._preprocess("--source-lang", "en", "--target-lang", "de", "--trainpref", os.path.join(work, "train"),
                         "--destdir", out, "--joined-dictionary")
    return out


def train(bin_dir: str, save_dir: str, activation: str, packed: bool, updates: int) -> list:
    """Runs fairseq-train; returns the logged loss of each update."""
    cmd = [os.path.join(os.path.dirname(sys.executable), "fairseq-train"), bin_dir, "--user-dir",
           os.path.join(REPO, "fairseq_lightseq"), *MODEL, *TRAINING, "--activation-fn", activation,
           "--ls-packed", str(packed), "--max-update", str(updates), "--save-dir", save_dir]
    r = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if r.returncode != 0:
        raise SystemExit(f"fairseq-train failed ({r.returncode}):\n{(r.stdout + r.stderr)[-3000:]}")
    records = [json.loads(line.split("| train_inner | ", 1)[1]) for line in (r.stdout + r.stderr).splitlines()
               if "| train_inner | " in line]
    losses = [float(x["loss"]) for x in records]
    if len(losses) != updates:
        raise SystemExit(f"expected {updates} logged losses, found {len(losses)}")
    return losses


def compare(padded: list, packed: list, params: tuple) -> dict:
    """The differences of two runs: losses per update, and the final parameters ({name: tensor} each)."""
    diffs = [abs(a - b) for a, b in zip(packed, padded)]
    differ = [i + 1 for i, d in enumerate(diffs) if d > 0]
    gaps = sorted(((float((params[1][k].double() - v.double()).abs().max()), k) for k, v in params[0].items()
                   if v.is_floating_point()), reverse=True)
    # the attention key biases have a zero gradient in exact arithmetic: Adam turns rounding noise into steps
    others = [g for g in gaps if not g[1].endswith("k_proj.bias")]
    return {"losses_differ": len(differ), "updates": len(diffs), "max_loss_difference": round(max(diffs), 6),
            "first_update_that_differs": differ[0] if differ else None,
            "max_parameter_difference": gaps[0][0], "parameter": gaps[0][1],
            "max_parameter_difference_without_key_biases": others[0][0], "parameter_without_key_biases": others[0][1],
            "padded_losses": padded, "packed_losses": packed}


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m scripts.packed_parity", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--multi30k", required=True, help="the folder of Multi30k's train.en.gz and train.de.gz")
    p.add_argument("--pairs", type=int, default=4000, help="how many sentence pairs to train on (default 4000)")
    p.add_argument("--updates", type=int, default=300, help="updates per run (default 300)")
    p.add_argument("--activations", nargs="+", default=["relu", "gelu"],
                   help="--activation-fn values (default relu gelu)")
    p.add_argument("--json", help="write the results here")
    a = p.parse_args(argv)
    corpus = multi30k.check_dir(a.multi30k)
    res = {"pairs": a.pairs, "model": MODEL, "training": TRAINING, "by_activation": {}}
    with tempfile.TemporaryDirectory() as work:
        bin_dir = data_bin(corpus, a.pairs, work)
        for act in a.activations:
            losses, params = [], []
            for packed in (False, True):
                save = os.path.join(work, f"{act}-{packed}")
                losses.append(train(bin_dir, save, act, packed, a.updates))
                params.append(load_file(os.path.join(save, "checkpoint_last.pt"))["model"])
            res["by_activation"][act] = compare(*losses, tuple(params))
            summary = {k: v for k, v in res["by_activation"][act].items() if not k.endswith("_losses")}
            print(act, json.dumps(summary), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(record(res, REPO, more=((corpus, "<multi30k>"),)), f, indent=1)
    return res


if __name__ == "__main__":
    main()
