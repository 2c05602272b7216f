"""The main job: build a corpus, learn sentencepiece, fairseq-preprocess, fairseq-train
ls_transformer with ls_label_smoothed_cross_entropy and ls_adam, fairseq-generate the test split,
score it with sacreBLEU, print BLEU and training tokens/s.

    python -m fairseq_lightseq.demo                       # the embedded corpus (corpus.py)
    python -m fairseq_lightseq.demo --data DIR            # a directory of raw parallel text, e.g. Multi30k
    python -m fairseq_lightseq.demo --native              # the same with fairseq's transformer/criterion/adam

DIR holds {train,valid|val,test*}.{SRC,TGT}[.gz]. Uses the GPU when there is one, else the CPU.
"""
import argparse
import os
import re
import shutil
import sys
import time

import torch

from fairseq_lightseq.demo.pipeline import (SPLIT_NAMES, encode_file, find_split, open_text, run, step,
                                            train_sentencepiece)

HERE = os.path.dirname(os.path.abspath(__file__))
USER_DIR = os.path.dirname(HERE)


def import_raw(data, raw, src, tgt):
    """Copies (and un-gzips) DIR's train/valid/test files into raw/{train,valid,test}.{src,tgt}."""
    os.makedirs(raw, exist_ok=True)
    for split, names in SPLIT_NAMES:
        for lang in (src, tgt):
            path = find_split(data, names, lang)
            with open_text(path) as fin, open(os.path.join(raw, f"{split}.{lang}"), "w") as fout:
                shutil.copyfileobj(fin, fout)
            print(f"  {split}.{lang} <- {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", help="directory of raw parallel text (default: the embedded corpus)")
    ap.add_argument("--src", default="en")
    ap.add_argument("--tgt", default="de")
    ap.add_argument("--workdir", default="demo_work")
    ap.add_argument("--vocab-size", type=int, help="sentencepiece vocabulary (default 256 embedded, 8000 --data)")
    ap.add_argument("--max-update", type=int, default=1200)
    ap.add_argument("--max-tokens", type=int, default=2048)
    ap.add_argument("--native", action="store_true", help="fairseq's own transformer, criterion and adam")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()

    t0 = time.time()
    work = os.path.abspath(args.workdir)
    raw, spm_dir, bin_dir = (os.path.join(work, d) for d in ("raw", "spm", "data-bin"))
    ckpt = os.path.join(work, "checkpoints-native" if args.native else "checkpoints")
    for d in (spm_dir, ckpt):
        shutil.rmtree(d, ignore_errors=True)
    shutil.rmtree(bin_dir, ignore_errors=True)
    src, tgt = args.src, args.tgt

    step("1/6 corpus")
    if args.data:
        import_raw(args.data, raw, src, tgt)
    else:
        from fairseq_lightseq.demo.corpus import write_corpus

        print(f"  embedded corpus: {write_corpus(raw)} pairs (fairseq_lightseq/demo/corpus.py)")

    step("2/6 sentencepiece (joint unigram model)")
    os.makedirs(spm_dir)
    sp = train_sentencepiece([os.path.join(raw, f"train.{l}") for l in (src, tgt)], os.path.join(spm_dir, "spm"),
                             args.vocab_size or (8000 if args.data else 256))
    for split in ("train", "valid", "test"):
        for l in (src, tgt):
            encode_file(sp, os.path.join(raw, f"{split}.{l}"), os.path.join(spm_dir, f"{split}.{l}"))

    step("3/6 fairseq-preprocess")
    py = sys.executable
    run([py, "-m", "fairseq_cli.preprocess", "--source-lang", src, "--target-lang", tgt,
         "--trainpref", f"{spm_dir}/train", "--validpref", f"{spm_dir}/valid", "--testpref", f"{spm_dir}/test",
         "--destdir", bin_dir, "--joined-dictionary", "--workers", "2"])

    step("4/6 fairseq-train " + ("(native fairseq)" if args.native else "(fairseq_lightseq)"))
    cuda = torch.cuda.is_available()
    arch, crit, opt = (("transformer", "label_smoothed_cross_entropy", "adam") if args.native else
                       ("ls_transformer", "ls_label_smoothed_cross_entropy", "ls_adam"))
    train_log = os.path.join(work, "train-native.log" if args.native else "train.log")
    t_train = time.time()
    run([py, "-m", "fairseq_cli.train", bin_dir, "--user-dir", USER_DIR, "--arch", arch,
         "--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "128", "--decoder-embed-dim", "128",
         "--encoder-ffn-embed-dim", "256", "--decoder-ffn-embed-dim", "256", "--encoder-attention-heads", "4",
         "--decoder-attention-heads", "4", "--share-all-embeddings", "--dropout", "0.1",
         "--criterion", crit, "--label-smoothing", "0.1", "--optimizer", opt, "--adam-betas", "(0.9, 0.98)",
         "--lr", "1e-3", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "300", "--clip-norm", "1.0",
         "--max-tokens", str(args.max_tokens), "--max-update", str(args.max_update), "--seed", str(args.seed),
         "--save-dir", ckpt, "--no-epoch-checkpoints", "--log-format", "simple", "--log-interval", "50",
         "--validate-interval-updates", "400", "--num-workers", "0"]
        + (["--fp16"] if cuda else ["--cpu"]), log=train_log)
    train_s = time.time() - t_train
    # fairseq's end-of-epoch summaries: "| train | epoch N | ... | wps W | ... | train_wall S |".
    epochs = re.findall(r"\| train \| epoch .*\| wps (\d+(?:\.\d+)?) .*\| train_wall (\d+)", open(train_log).read())

    # target tokens / training wall time over all epochs (fairseq's wps weighted by each epoch's time)
    tokens_per_s = sum(float(w) * int(t) for w, t in epochs) / max(sum(int(t) for _, t in epochs), 1)

    step("5/6 fairseq-generate (beam 4) on the test split")
    gen = run([py, "-m", "fairseq_cli.generate", bin_dir, "--user-dir", USER_DIR, "--path",
               os.path.join(ckpt, "checkpoint_last.pt"), "--gen-subset", "test", "--beam", "4",
               "--batch-size", "128", "--required-batch-size-multiple", "1",
               "--remove-bpe", "sentencepiece", "--nbest", "1"]
              + ([] if cuda else ["--cpu"]), log=os.path.join(work, "generate.log"))
    hyps = {int(m.group(1)): m.group(2) for m in re.finditer(r"^D-(\d+)\t[^\t]*\t(.*)$", gen, re.M)}
    with open(os.path.join(raw, f"test.{tgt}")) as f:
        refs = [l.strip() for l in f]
    if len(hyps) != len(refs):
        sys.exit(f"fairseq-generate produced {len(hyps)} hypotheses for {len(refs)} references")

    step("6/6 sacreBLEU")
    import sacrebleu

    bleu = sacrebleu.corpus_bleu([hyps[i] for i in range(len(refs))], [refs])
    print(f"  {bleu}")
    print(f"\nRESULT  {'native' if args.native else 'fairseq_lightseq'}  BLEU {bleu.score:.2f}  "
          f"train tokens/s {tokens_per_s:.0f}  "
          f"train time {train_s:.0f}s  total {time.time() - t0:.0f}s  device {'cuda' if cuda else 'cpu'}")


if __name__ == "__main__":
    main()
