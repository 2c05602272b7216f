"""Data for the mBART parity runs: the English and German sentences of multi30k, one joint sentencepiece
model, the monolingual data-bins of mBART's denoising pretraining and the en-de data-bin of its fine-tuning,
all with one dictionary.

    python examples/mbart/prepare.py MULTI30K_DIR OUT_DIR [--vocab-size 2000]

MULTI30K_DIR holds {train,val,test_2016_flickr}.{en,de}.gz (29000 / 1014 / 1000 lines each).
OUT_DIR gets:
  spm.model, spm.vocab    sentencepiece (unigram) learnt on the training sentences of both languages
  mono/dict.txt, mono/en/, mono/de/
                          multilingual_denoising data (fairseq-preprocess --only-source per language):
                          train / valid = each language's train / val
  pair/                   translation_from_pretrained_bart data, en -> de (dict.en.txt = dict.de.txt =
                          mono/dict.txt): train / valid / test = train / val / test_2016_flickr
  raw/test.de             the test references, detokenized (what sacreBLEU scores against)
The fairseq tools are taken from the interpreter's directory (the venv that has fairseq).
"""
import argparse
import os
import shutil
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "common"))
from multi30k import SPLITS, preprocess, read, write  # noqa: E402

LANGS = ("en", "de")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("multi30k")
    ap.add_argument("out")
    ap.add_argument("--vocab-size", type=int, default=2000)
    args = ap.parse_args()
    import sentencepiece as spm

    os.makedirs(os.path.join(args.out, "raw"), exist_ok=True)
    text = {s: {lang: read(args.multi30k, name, lang) for lang in LANGS} for s, name in SPLITS.items()}
    write(os.path.join(args.out, "raw", "spm_train.txt"), text["train"]["en"] + text["train"]["de"])
    spm.SentencePieceTrainer.train(input=os.path.join(args.out, "raw", "spm_train.txt"),
                                   model_prefix=os.path.join(args.out, "spm"), vocab_size=args.vocab_size,
                                   character_coverage=1.0, model_type="unigram", num_threads=2)
    sp = spm.SentencePieceProcessor(model_file=os.path.join(args.out, "spm.model"))
    for split in SPLITS:
        for lang in LANGS:
            write(os.path.join(args.out, "raw", f"{split}.spm.{lang}"),
                  [" ".join(p) for p in sp.encode(text[split][lang], out_type=str)])
    write(os.path.join(args.out, "raw", "test.de"), text["test"]["de"])
    # one dictionary for both languages (mBART's): every piece of both training sides
    write(os.path.join(args.out, "raw", "both.spm"), [" ".join(p) for lang in LANGS
                                                       for p in sp.encode(text["train"][lang], out_type=str)])
    preprocess(args.out, "--only-source", "--trainpref", "raw/both.spm", "--destdir", "dict")
    for lang in LANGS:
        preprocess(args.out, "--only-source", "--srcdict", "dict/dict.txt", "--trainpref", f"raw/train.spm.{lang}",
                   "--validpref", f"raw/valid.spm.{lang}", "--destdir", f"mono/{lang}")
    shutil.copy(os.path.join(args.out, "dict", "dict.txt"), os.path.join(args.out, "mono", "dict.txt"))
    preprocess(args.out, "--source-lang", "en", "--target-lang", "de", "--srcdict", "dict/dict.txt", "--tgtdict",
               "dict/dict.txt", "--trainpref", "raw/train.spm", "--validpref", "raw/valid.spm", "--testpref",
               "raw/test.spm", "--destdir", "pair")
    print(f"prepare.py: wrote {args.out}/mono and {args.out}/pair")


if __name__ == "__main__":
    main()
