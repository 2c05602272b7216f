"""Data for the RoBERTa parity runs: the English and German sentences of multi30k, one joint
sentencepiece model, and two fairseq data-bins.

    python examples/roberta/prepare.py MULTI30K_DIR OUT_DIR [--vocab-size 1000] [--finetune-train 4000]

MULTI30K_DIR holds {train,val,test_2016_flickr}.{en,de}.gz (29000 / 1014 / 1000 lines each).
OUT_DIR gets:
  spm.model, spm.vocab           sentencepiece (unigram) learnt on the training sentences of both languages
  mlm-bin/                       masked-LM data (fairseq-preprocess --only-source): train = every training
                                 sentence of both languages, shuffled; valid / test = val / test_2016_flickr
  cls-bin/input0, cls-bin/label  sentence classification "is it English or German" (label en / de), the
                                 dictionary of mlm-bin; train = --finetune-train sentences drawn from the
                                 training set (balanced), valid / test = all of val / test_2016_flickr
The fairseq tools are taken from the interpreter's directory (the venv that has fairseq).
"""
import argparse
import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "common"))
from multi30k import SPLITS, preprocess, read, write  # noqa: E402


def preprocess_splits(out, dest, pref, srcdict=None):
    """fairseq-preprocess --only-source of PREF{train,valid,test} into DEST (with SRCDICT's dictionary if given)."""
    preprocess(out, "--only-source", "--trainpref", pref + "train", "--validpref", pref + "valid",
               "--testpref", pref + "test", "--destdir", dest, *(["--srcdict", srcdict] if srcdict else []))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("multi30k")
    ap.add_argument("out")
    ap.add_argument("--vocab-size", type=int, default=1000)
    ap.add_argument("--finetune-train", type=int, default=4000, help="training sentences of the classifier")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    import sentencepiece as spm

    os.makedirs(args.out, exist_ok=True)
    rng = random.Random(args.seed)
    text = {s: {lang: read(args.multi30k, name, lang) for lang in ("en", "de")} for s, name in SPLITS.items()}
    write(os.path.join(args.out, "spm_train.txt"), text["train"]["en"] + text["train"]["de"])
    spm.SentencePieceTrainer.train(input=os.path.join(args.out, "spm_train.txt"),
                                   model_prefix=os.path.join(args.out, "spm"), vocab_size=args.vocab_size,
                                   character_coverage=1.0, model_type="unigram", num_threads=2)
    sp = spm.SentencePieceProcessor(model_file=os.path.join(args.out, "spm.model"))
    raw = os.path.join(args.out, "raw")
    os.makedirs(raw, exist_ok=True)
    for split in SPLITS:
        rows = [(" ".join(p), lang) for lang in ("en", "de")
                for p in sp.encode(text[split][lang], out_type=str)]
        rng.shuffle(rows)
        write(os.path.join(raw, f"mlm.{split}"), [r[0] for r in rows])
        if split == "train":  # the classifier's training set: a balanced sample
            per = args.finetune_train // 2
            rows = [r for lang in ("en", "de") for r in [x for x in rows if x[1] == lang][:per]]
            rng.shuffle(rows)
        write(os.path.join(raw, f"cls.{split}"), [r[0] for r in rows])
        write(os.path.join(raw, f"label.{split}"), [r[1] for r in rows])
    preprocess_splits(args.out, "mlm-bin", "raw/mlm.")
    preprocess_splits(args.out, "cls-bin/input0", "raw/cls.", srcdict="mlm-bin/dict.txt")
    preprocess_splits(args.out, "cls-bin/label", "raw/label.")
    print(f"prepare.py: wrote {args.out}/mlm-bin and {args.out}/cls-bin")


if __name__ == "__main__":
    main()
