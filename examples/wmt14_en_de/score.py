"""BLEU of fairseq-generate's output against the raw reference, two ways.

    python score.py GENERATE_OUTPUT RAW_REF [--out-prefix P]

1. Detokenised sacreBLEU (13a, the standard comparable number): the D- lines (after
   --remove-bpe sentencepiece) in sentence-id order against RAW_REF as given.
2. "Tokenised compound-split BLEU", the number fairseq and Vaswani et al. report for WMT14 En-De
   (fairseq's examples/translation/scripts/compound_split_bleu.sh): both sides tokenised, then every
   intra-word hyphen split as "##AT##-##AT##", then plain BLEU on the tokens. fairseq tokenises with
   Moses; sacremoses is not a dependency here, so both sides go through sacreBLEU's 13a tokenizer
   (Moses-like: splits punctuation, keeps hyphenated words together) and are scored with
   tokenize="none". It follows the same recipe but is not bit-identical to Moses-tokenised numbers.
Writes P.hyp (detokenised hypotheses) when --out-prefix is given; prints both scores.
"""
import argparse
import re
import sys

import sacrebleu
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

COMPOUND = re.compile(r"(\S)-(\S)")


def read_hypotheses(gen_output: str):
    """The D- lines of fairseq-generate output, by sentence id: {id: text}."""
    hyps = {}
    with open(gen_output, encoding="utf-8") as f:
        for line in f:
            if line.startswith("D-"):
                head, _score, text = (line.rstrip("\n").split("\t") + ["", ""])[:3]
                hyps[int(head[2:])] = text
    return hyps


def compound_split(tokenized: str) -> str:
    return COMPOUND.sub(r"\1 ##AT##-##AT## \2", tokenized)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gen_output")
    ap.add_argument("ref")
    ap.add_argument("--out-prefix")
    args = ap.parse_args()

    with open(args.ref, encoding="utf-8") as f:
        refs = [line.rstrip("\n") for line in f]
    hyps = read_hypotheses(args.gen_output)
    if sorted(hyps) != list(range(len(refs))):
        sys.exit(f"score.py: {args.gen_output} has hypotheses for {len(hyps)} sentences, "
                 f"{args.ref} has {len(refs)} references (ids must be 0..{len(refs) - 1})")
    hyps = [hyps[i] for i in range(len(refs))]
    if args.out_prefix:
        with open(args.out_prefix + ".hyp", "w", encoding="utf-8") as f:
            f.writelines(h + "\n" for h in hyps)

    metric = sacrebleu.BLEU()
    detok = metric.corpus_score(hyps, [refs])
    sig = metric.get_signature()
    tok = Tokenizer13a()
    split = sacrebleu.corpus_bleu([compound_split(tok(h)) for h in hyps], [[compound_split(tok(r)) for r in refs]],
                                  tokenize="none")
    print(f"detokenized sacreBLEU: {detok.score:.2f}  ({detok})  signature {sig}")
    print(f"tokenized compound-split BLEU: {split.score:.2f}  ({split})  (13a tokens, ##AT##-##AT## split)")


if __name__ == "__main__":
    main()
