"""Sentencepiece step of prepare.sh: learn a joint model on the raw training text, encode every
split, drop bad training pairs (fairseq's clean-corpus-n.perl rule on subword counts: empty, longer
than --max-len pieces, or a length ratio above --ratio). valid/test are encoded but never filtered,
so their lines stay aligned with the raw references sacreBLEU reads.

    python spm_encode.py RAW_DIR OUT_DIR [--vocab-size 32000] [--src en --tgt de]

RAW_DIR holds {train,valid,test}.{src,tgt} (one sentence per line, untokenised);
writes OUT_DIR/spm.model, OUT_DIR/spm.vocab and OUT_DIR/{train,valid,test}.{src,tgt} (pieces).
"""
import argparse
import os
import sys
import time


def encode_file(sp, path, batch=20000):
    """Yields the space-joined pieces of each line of `path` (batched: spm encodes lists in threads)."""
    with open(path, encoding="utf-8") as f:
        lines = []
        for line in f:
            lines.append(line.rstrip("\n").strip())
            if len(lines) == batch:
                yield from (" ".join(p) for p in sp.encode(lines, out_type=str))
                lines = []
        if lines:
            yield from (" ".join(p) for p in sp.encode(lines, out_type=str))


def keep(a: str, b: str, min_len: int, max_len: int, ratio: float) -> bool:
    la, lb = len(a.split()), len(b.split())
    if not (min_len <= la <= max_len and min_len <= lb <= max_len):
        return False
    return max(la, lb) <= ratio * min(la, lb)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("raw")
    ap.add_argument("out")
    ap.add_argument("--src", default="en")
    ap.add_argument("--tgt", default="de")
    ap.add_argument("--vocab-size", type=int, default=32000)
    ap.add_argument("--model-type", default="unigram", choices=["unigram", "bpe"])
    ap.add_argument("--character-coverage", type=float, default=0.9999,
                    help="below 1.0 so that the stray scripts of web-crawled text do not take vocabulary slots")
    ap.add_argument("--input-sentence-size", type=int, default=4000000,
                    help="sentences sampled to learn the model (bounds memory on the 4.5M-pair corpus)")
    ap.add_argument("--min-len", type=int, default=1)
    ap.add_argument("--max-len", type=int, default=250)
    ap.add_argument("--ratio", type=float, default=1.5)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()

    import sentencepiece as spm

    os.makedirs(args.out, exist_ok=True)
    raw = lambda split, lang: os.path.join(args.raw, f"{split}.{lang}")  # noqa: E731
    for split in ("train", "valid", "test"):
        for lang in (args.src, args.tgt):
            if not os.path.isfile(raw(split, lang)):
                sys.exit(f"spm_encode.py: missing {raw(split, lang)} (need {{train,valid,test}}.{{{args.src},{args.tgt}}})")

    t0 = time.time()
    prefix = os.path.join(args.out, "spm")
    spm.SentencePieceTrainer.train(
        input=",".join(raw("train", l) for l in (args.src, args.tgt)), model_prefix=prefix,
        vocab_size=args.vocab_size, model_type=args.model_type, character_coverage=args.character_coverage,
        input_sentence_size=args.input_sentence_size, shuffle_input_sentence=True,
        # fairseq's dictionary adds <s> <pad> </s> <unk> itself: keep only <unk> in the model
        bos_id=-1, eos_id=-1, pad_id=-1, unk_id=0, hard_vocab_limit=False,
        num_threads=args.threads, minloglevel=2)
    sp = spm.SentencePieceProcessor(model_file=prefix + ".model")
    print(f"spm_encode.py: learned {prefix}.model ({sp.get_piece_size()} pieces) in {time.time() - t0:.0f}s", flush=True)

    for split in ("train", "valid", "test"):
        kept = total = 0
        with open(os.path.join(args.out, f"{split}.{args.src}"), "w", encoding="utf-8") as fs, \
                open(os.path.join(args.out, f"{split}.{args.tgt}"), "w", encoding="utf-8") as ft:
            for a, b in zip(encode_file(sp, raw(split, args.src)), encode_file(sp, raw(split, args.tgt)), strict=True):
                total += 1
                if split == "train" and not keep(a, b, args.min_len, args.max_len, args.ratio):
                    continue
                kept += 1
                fs.write(a + "\n")
                ft.write(b + "\n")
        print(f"spm_encode.py: {split}: {kept}/{total} pairs" + (" kept after cleaning" if split == "train" else ""),
              flush=True)


if __name__ == "__main__":
    main()
