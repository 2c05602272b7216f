"""Language models on real text with fairseq's command line: ls_transformer_lm (fairseq_lightseq)
against fairseq's own transformer_lm with identical settings and seeds.

    python examples/language_model/run.py words DATA_DIR WORKDIR [options]   # sentencepiece LM
    python examples/language_model/run.py bytes WORKDIR [--source DIR] [options]  # byte-level LM

words: DATA_DIR holds {train,valid|val|dev,test*}.LANG[.gz] (one sentence per line, untokenised), e.g.
  a Multi30k checkout. Learns a sentencepiece model on train, fairseq-preprocess --only-source, then
  for each seed trains the ls and the native side and runs fairseq-eval-lm on valid and test
  (one sentence per sample, --sample-break-mode eos). Prints perplexity per side and seed, the
  means and the relative difference.
bytes: the *.py files under --source (default: the standard library of the interpreter running this
  script, sysconfig's 'stdlib', without site-packages), split by a hash of each file's path into
  train/valid/test and capped (--max-*-mb); one token per byte (two hex digits; a newline is
  fairseq's end-of-line symbol). Trains the ls side in one process and, with --sp, with
  --sequence-parallel-size 2 over 2 CPU processes (torchrun, gloo) on the same batches; eval-lm with
  --context-window; prints bits per byte and how far apart the two runs' logged losses are.

Everything goes into WORKDIR (results.json holds the numbers). Runs on the CPU (--cpu) unless --gpu.
Set OMP_NUM_THREADS to the threads each process may use.
"""
import argparse
import hashlib
import json
import os
import re
import shutil
import socket
import statistics
import sys
import sysconfig
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)
from fairseq_lightseq.demo.pipeline import (SPLIT_NAMES, encode_file, find_split, open_text, run,  # noqa: E402
                                            step, train_sentencepiece)

USER_DIR = os.path.join(ROOT, "fairseq_lightseq")
PY = sys.executable
SPLITS = ("train", "valid", "test")
# Model, criterion and optimizer of each side; every other option is shared.
SIDES = {
    "ls": ["--arch", "ls_transformer_lm", "--criterion", "ls_cross_entropy", "--optimizer", "ls_adam"],
    "native": ["--arch", "transformer_lm", "--criterion", "cross_entropy", "--optimizer", "adam"],
}


def show_progress(line):
    """The lines of fairseq's output worth streaming: per-interval and validation records, the end."""
    return any(k in line for k in ("| train_inner |", "| valid |", "done training", "num. shared model params",
                                    "Loss (base 2)", "Evaluated", "Error", "error"))


def device_args(a):
    return [] if a.gpu else ["--cpu"]


def train_args(a, bin_dir, save_dir, side, seed):
    """fairseq-train's arguments for one side (all but the launcher)."""
    return [bin_dir, "--user-dir", USER_DIR, "--task", "language_modeling", *SIDES[side],
            # --decoder-input-dim/--decoder-output-dim too: transformer_lm keeps 512 for them otherwise
            # and projects the embeddings in and out
            "--decoder-layers", str(a.layers), "--decoder-embed-dim", str(a.dim), "--decoder-input-dim", str(a.dim),
            "--decoder-output-dim", str(a.dim),
            "--decoder-ffn-embed-dim", str(4 * a.dim), "--decoder-attention-heads", str(a.heads),
            "--share-decoder-input-output-embed", "--dropout", str(a.dropout),
            "--tokens-per-sample", str(a.tokens_per_sample), "--sample-break-mode", a.break_mode,
            "--adam-betas", "(0.9, 0.98)", "--weight-decay", "0.01", "--clip-norm", "0.0",
            "--lr", str(a.lr), "--lr-scheduler", "inverse_sqrt", "--warmup-updates", str(a.warmup),
            "--warmup-init-lr", "1e-07", "--max-tokens", str(a.max_tokens), "--max-update", str(a.max_update),
            "--required-batch-size-multiple", "1", "--seed", str(seed), "--save-dir", save_dir,
            "--no-epoch-checkpoints", "--no-save-optimizer-state", "--log-format", "json",
            "--log-interval", str(a.log_interval), "--num-workers", "0", *device_args(a)]


def train(a, bin_dir, save_dir, side, seed, sequence_parallel=1):
    """fairseq-train one side (in P = sequence_parallel processes started by torchrun when P > 1);
    returns (log, wall seconds)."""
    shutil.rmtree(save_dir, ignore_errors=True)
    os.makedirs(save_dir)
    args = train_args(a, bin_dir, save_dir, side, seed)
    if sequence_parallel == 1:
        cmd = [PY, "-m", "fairseq_cli.train", *args]
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cmd = [PY, "-m", "torch.distributed.run", "--nproc_per_node", str(sequence_parallel),
               "--master_addr", "127.0.0.1", "--master_port", str(port), "-m", "fairseq_cli.train", *args,
               "--sequence-parallel-size", str(sequence_parallel), "--distributed-backend", "gloo",
               "--ddp-backend", "legacy_ddp"]
    t = time.time()
    log = run(cmd, log=os.path.join(save_dir, "train.log"), show=show_progress)
    return log, time.time() - t


def eval_lm(a, bin_dir, ckpt, subset, extra=()):
    """fairseq-eval-lm on one subset: {tokens, loss2 (bits per token), ppl, seconds}."""
    t = time.time()
    # --required-batch-size-multiple 1: fairseq-fixed's batch_by_size drops a last batch whose size is
    # not a multiple of it (default 8), which would leave tokens out of the score
    out = run([PY, "-m", "fairseq_cli.eval_lm", bin_dir, "--user-dir", USER_DIR, "--path", ckpt,
               "--task", "language_modeling", "--gen-subset", subset, "--tokens-per-sample", str(a.tokens_per_sample),
               "--sample-break-mode", a.break_mode, "--max-tokens", str(a.eval_max_tokens),
               "--required-batch-size-multiple", "1", "--num-workers", "0", *device_args(a), *extra],
              show=show_progress)
    tokens = re.search(r"Evaluated ([\d,]+) tokens", out)
    loss = re.search(r"Loss \(base 2\): ([\d.]+), Perplexity: ([\d.]+)", out)
    if not (tokens and loss):
        sys.exit(f"no score in fairseq-eval-lm's output for {ckpt} on {subset}")
    return {"tokens": int(tokens.group(1).replace(",", "")), "loss2": float(loss.group(1)),
            "ppl": 2 ** float(loss.group(1)), "seconds": round(time.time() - t, 1)}


def train_records(log):
    """fairseq's json train_inner records: [{num_updates, loss, wpb, ...}]."""
    return [json.loads(m) for m in re.findall(r"\| train_inner \| (\{.*\})", log)]


def preprocess(text_dir, bin_dir, workers):
    shutil.rmtree(bin_dir, ignore_errors=True)
    run([PY, "-m", "fairseq_cli.preprocess", "--only-source", "--trainpref", f"{text_dir}/train",
         "--validpref", f"{text_dir}/valid", "--testpref", f"{text_dir}/test", "--destdir", bin_dir,
         "--workers", str(workers)], show=lambda line: "Dictionary" in line or "tokens" in line)


def save_results(work, results):
    with open(os.path.join(work, "results.json"), "w") as f:
        json.dump(results, f, indent=1)


def settings(a):
    """The command line's options, for results.json."""
    return {k: v for k, v in vars(a).items() if k != "func"}


def rel(x, ref):
    return (x - ref) / ref


# ----------------------------------------------------------------------------------------- words

def cmd_words(a):
    t0 = time.time()
    work = os.path.abspath(a.workdir)
    raw, spm_dir, bin_dir = (os.path.join(work, d) for d in ("raw", "spm", "data-bin"))
    os.makedirs(raw, exist_ok=True)
    shutil.rmtree(spm_dir, ignore_errors=True)
    os.makedirs(spm_dir)

    step(f"1/5 corpus: the {a.lang} side of {a.data}")
    for split, names in SPLIT_NAMES:
        path = find_split(a.data, names, a.lang)
        with open_text(path) as fin, open(os.path.join(raw, split), "w", encoding="utf-8") as fout:
            shutil.copyfileobj(fin, fout)
        print(f"  {split} <- {path}")

    step(f"2/5 sentencepiece ({a.spm_type}, {a.vocab_size} pieces) on train, encode every split")
    sp = train_sentencepiece([os.path.join(raw, "train")], os.path.join(spm_dir, "spm"), a.vocab_size, a.spm_type)
    corpus = {}
    for split in SPLITS:
        lines, words = encode_file(sp, os.path.join(raw, split), os.path.join(spm_dir, split))
        with open(os.path.join(spm_dir, split), encoding="utf-8") as f:
            pieces = sum(len(line.split()) for line in f)
        corpus[split] = {"sentences": lines, "words": words, "pieces": pieces}
        print(f"  {split}: {lines} sentences, {words} words, {pieces} pieces")

    step("3/5 fairseq-preprocess --only-source")
    preprocess(spm_dir, bin_dir, a.workers)

    results = {"kind": "words", "data": os.path.abspath(a.data), "settings": settings(a), "corpus": corpus, "runs": []}
    step(f"4/5 train and evaluate: sides {', '.join(a.sides)}, seeds {', '.join(map(str, a.seeds))}")
    for seed in a.seeds:
        for side in a.sides:
            step(f"  {side}, seed {seed}: fairseq-train ({a.max_update} updates)")
            save_dir = os.path.join(work, f"ckpt-{side}-seed{seed}")
            log, train_s = train(a, bin_dir, save_dir, side, seed)
            records = train_records(log)
            entry = {"side": side, "seed": seed, "train_seconds": round(train_s, 1),
                     "last_train_loss": float(records[-1]["loss"]) if records else None}
            for subset in a.eval_subsets:
                score = eval_lm(a, bin_dir, os.path.join(save_dir, "checkpoint_last.pt"), subset)
                c = corpus[subset]
                if score["tokens"] != c["pieces"] + c["sentences"]:  # every piece and end of sentence scored
                    sys.exit(f"eval-lm scored {score['tokens']} tokens of {subset}, which has "
                             f"{c['pieces'] + c['sentences']} (pieces + ends of sentence)")
                # perplexity per word (whitespace word, end of sentence counted as one): same total loss
                score["word_ppl"] = 2 ** (score["loss2"] * score["tokens"] / (c["words"] + c["sentences"]))
                entry[subset] = score
                print(f"  {side} seed {seed} {subset}: ppl {score['ppl']:.3f} per piece, "
                      f"{score['word_ppl']:.3f} per word")
            results["runs"].append(entry)
            save_results(work, results)

    step("5/5 results")
    results["summary"] = words_table(results["runs"], a.sides, a.eval_subsets)
    results["total_seconds"] = round(time.time() - t0, 1)
    save_results(work, results)
    print(f"\ntotal {results['total_seconds']:.0f}s; numbers in {os.path.join(work, 'results.json')}")


def words_table(runs, sides, subsets):
    """Prints perplexity (per piece and per word) per side and seed, the means, and the relative
    difference of each side's mean to the last side's; returns the means and differences."""
    summary = {}
    for subset in subsets:
        for unit, key in (("piece", "ppl"), ("word", "word_ppl")):
            print(f"\n{subset} perplexity per {unit}")
            print(f"  {'seed':>6} " + " ".join(f"{s:>10}" for s in sides) + (
                f" {'rel. diff':>10}" if len(sides) == 2 else ""))
            seeds = sorted({r["seed"] for r in runs})
            for seed in seeds:
                row = [next(r[subset][key] for r in runs if r["seed"] == seed and r["side"] == s) for s in sides]
                diff = f" {100 * rel(row[0], row[1]):+9.2f}%" if len(sides) == 2 else ""
                print(f"  {seed:>6} " + " ".join(f"{x:10.3f}" for x in row) + diff)
            means = {s: statistics.mean(r[subset][key] for r in runs if r["side"] == s) for s in sides}
            spread = {s: statistics.stdev(r[subset][key] for r in runs if r["side"] == s) if len(seeds) > 1 else 0.0
                      for s in sides}
            line = f"  {'mean':>6} " + " ".join(f"{means[s]:10.3f}" for s in sides)
            entry = {"mean": means, "stdev_over_seeds": spread}
            if len(sides) == 2:
                entry["rel_diff"] = rel(means[sides[0]], means[sides[1]])
                line += f" {100 * entry['rel_diff']:+9.2f}%"
            print(line)
            if len(seeds) > 1:
                print(f"  {'stdev':>6} " + " ".join(f"{spread[s]:10.3f}" for s in sides))
            summary[f"{subset}_{key}"] = entry
    return summary


# ----------------------------------------------------------------------------------------- bytes

def stdlib_files(source):
    """The *.py files under `source` (site-packages and dist-packages left out), relative paths, sorted."""
    found = []
    for d, dirs, files in os.walk(source):
        dirs[:] = sorted(x for x in dirs if x not in ("site-packages", "dist-packages", "__pycache__"))
        found += [os.path.relpath(os.path.join(d, f), source) for f in files if f.endswith(".py")]
    return sorted(found)


def split_of(relpath, valid_percent, test_percent):
    """train, valid or test for a file, from a hash of its path (stable across machines and runs)."""
    h = int(hashlib.sha1(relpath.encode("utf-8")).hexdigest()[:8], 16) % 100
    return "test" if h < test_percent else "valid" if h < test_percent + valid_percent else "train"


def write_bytes(data, f):
    """One line of space-separated two-hex-digit symbols per line of `data` (bytes); the newline
    itself is fairseq's end-of-line symbol. Returns the number of tokens fairseq will make of it."""
    lines = data.split(b"\n")
    if data.endswith(b"\n"):
        lines.pop()
    for line in lines:
        f.write(" ".join(f"{b:02x}" for b in line) + "\n")
    return len(data) + (0 if data.endswith(b"\n") else 1)  # a file without a final newline gets one


def byte_corpus(source, out_dir, a):
    """Writes out_dir/{train,valid,test}; returns {split: {files, bytes, tokens}}. Files are taken in
    the order of their path hashes until a split's cap is reached."""
    files = stdlib_files(source)
    if not files:
        sys.exit(f"no .py files under {source}")
    caps = {"train": a.max_train_mb, "valid": a.max_valid_mb, "test": a.max_test_mb}
    stats = {s: {"files": 0, "bytes": 0, "tokens": 0, "files_available": 0, "bytes_available": 0} for s in SPLITS}
    order = sorted(files, key=lambda p: hashlib.sha1(p.encode("utf-8")).hexdigest())
    outs = {s: open(os.path.join(out_dir, s), "w", encoding="ascii") for s in SPLITS}
    try:
        for rel_path in order:
            split = split_of(rel_path, a.valid_percent, a.test_percent)
            with open(os.path.join(source, rel_path), "rb") as f:
                data = f.read()
            st = stats[split]
            st["files_available"] += 1
            st["bytes_available"] += len(data)
            if not data or st["bytes"] + len(data) > caps[split] * 1e6:
                continue
            st["tokens"] += write_bytes(data, outs[split])
            st["files"] += 1
            st["bytes"] += len(data)
    finally:
        for f in outs.values():
            f.close()
    return stats


def cmd_bytes(a):
    t0 = time.time()
    work = os.path.abspath(a.workdir)
    text_dir, bin_dir = os.path.join(work, "bytes"), os.path.join(work, "data-bin")
    source = os.path.abspath(a.source or sysconfig.get_paths()["stdlib"])
    os.makedirs(text_dir, exist_ok=True)

    step(f"1/4 corpus: the .py files of {source}, split by path hash, one token per byte")
    corpus = byte_corpus(source, text_dir, a)
    for split, st in corpus.items():
        print(f"  {split}: {st['files']} files, {st['bytes'] / 1e6:.2f} MB "
              f"(of {st['files_available']} files, {st['bytes_available'] / 1e6:.2f} MB in the split)")

    step("2/4 fairseq-preprocess --only-source (a dictionary of the bytes seen in train)")
    preprocess(text_dir, bin_dir, a.workers)

    results = {"kind": "bytes", "source": source, "settings": settings(a), "corpus": corpus, "runs": []}
    runs = [("ls", 1)] + ([("native", 1)] if a.native else []) + ([("ls", 2)] if a.sp else [])
    step(f"3/4 train and evaluate: {', '.join(f'{s} (P={p})' for s, p in runs)}, seed {a.seed}")
    logs = {}
    for side, p in runs:
        name = f"{side}-sp{p}" if p > 1 else side
        step(f"  {name}: fairseq-train ({a.max_update} updates, {a.tokens_per_sample} bytes per sample)")
        save_dir = os.path.join(work, f"ckpt-{name}")
        log, train_s = train(a, bin_dir, save_dir, side, a.seed, sequence_parallel=p)
        logs[name] = train_records(log)
        entry = {"name": name, "side": side, "sequence_parallel": p, "train_seconds": round(train_s, 1),
                 "train_losses": [(int(r["num_updates"]), float(r["loss"]), float(r["wpb"])) for r in logs[name]]}
        valid = re.findall(r"\| valid \| (\{.*\})", log)
        if valid:
            entry["valid_loss_during_training"] = float(json.loads(valid[-1])["valid_loss"])
        for subset in a.eval_subsets:
            score = eval_lm(a, bin_dir, os.path.join(save_dir, "checkpoint_last.pt"), subset,
                            extra=["--context-window", str(a.context_window)])
            if score["tokens"] != corpus[subset]["tokens"]:
                sys.exit(f"eval-lm scored {score['tokens']} tokens of {subset}, which has {corpus[subset]['tokens']}")
            # fairseq's base-2 loss per token = bits per token; per byte of the files:
            score["bits_per_byte"] = score["loss2"] * score["tokens"] / corpus[subset]["bytes"]
            entry[subset] = score
            print(f"  {name} {subset}: {score['bits_per_byte']:.4f} bits per byte")
        results["runs"].append(entry)
        save_results(work, results)

    step("4/4 results")
    print(f"\n  {'run':>10} {'train s':>8} " + " ".join(f"{s + ' bpb':>10}" for s in a.eval_subsets))
    for r in results["runs"]:
        print(f"  {r['name']:>10} {r['train_seconds']:8.0f} "
              + " ".join(f"{r[s]['bits_per_byte']:10.4f}" for s in a.eval_subsets))
    if "ls-sp2" in logs:
        one, sp = logs["ls"], logs["ls-sp2"]
        same_batches = [r["wpb"] for r in one] == [r["wpb"] for r in sp]
        diffs = [abs(float(x["loss"]) - float(y["loss"])) for x, y in zip(one, sp)]
        results["sp_vs_one_process"] = {"logged": len(diffs), "same_words_per_batch": same_batches,
                                        "max_abs_loss_diff": max(diffs) if diffs else None}
        print(f"\n  SP 2 vs 1 process: {len(diffs)} logged losses (every {a.log_interval} updates), "
              f"max |difference| {max(diffs) if diffs else float('nan'):.2g}, "
              f"same words per batch: {same_batches}")
    results["total_seconds"] = round(time.time() - t0, 1)
    save_results(work, results)
    print(f"\ntotal {results['total_seconds']:.0f}s; numbers in {os.path.join(work, 'results.json')}")


# ------------------------------------------------------------------------------------------ main

def add_training_options(p, max_update, warmup, max_tokens, tokens_per_sample, log_interval):
    """The model and training options every side shares, with the subcommand's defaults."""
    g = p.add_argument_group("model and training (identical for every side)")
    g.add_argument("--layers", type=int, default=2)
    g.add_argument("--dim", type=int, default=128, help="width; the FFN is 4x")
    g.add_argument("--heads", type=int, default=4)
    g.add_argument("--dropout", type=float, default=0.1)
    g.add_argument("--lr", type=float, default=1e-3)
    g.add_argument("--warmup", type=int, default=warmup, help="inverse_sqrt warm-up updates")
    g.add_argument("--max-update", type=int, default=max_update)
    g.add_argument("--max-tokens", type=int, default=max_tokens)
    g.add_argument("--tokens-per-sample", type=int, default=tokens_per_sample)
    g.add_argument("--eval-max-tokens", type=int, default=8192)
    g.add_argument("--eval-subsets", nargs="+", default=["valid", "test"], choices=["valid", "test"],
                   help="the splits fairseq-eval-lm scores")
    g.add_argument("--log-interval", type=int, default=log_interval)
    g.add_argument("--workers", type=int, default=1, help="fairseq-preprocess workers")
    g.add_argument("--gpu", action="store_true", help="train on the GPU (default: --cpu)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    w = sub.add_parser("words", help="sentencepiece LM on a sentence corpus, ls vs native")
    w.add_argument("data", help="directory of {train,valid|val|dev,test*}.LANG[.gz], e.g. a Multi30k checkout")
    w.add_argument("workdir")
    w.add_argument("--lang", default="en")
    w.add_argument("--vocab-size", type=int, default=4000)
    w.add_argument("--spm-type", default="unigram", choices=["unigram", "bpe"])
    w.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    w.add_argument("--sides", nargs="+", default=["ls", "native"], choices=list(SIDES))
    add_training_options(w, max_update=400, warmup=100, max_tokens=1024, tokens_per_sample=128, log_interval=100)
    w.set_defaults(func=cmd_words, break_mode="eos")  # one sentence per sample

    b = sub.add_parser("bytes", help="byte-level LM on source files, 1 process and SP 2")
    b.add_argument("workdir")
    b.add_argument("--source", help="directory whose *.py files make the corpus (default: this Python's stdlib)")
    b.add_argument("--max-train-mb", type=float, default=2.0)
    b.add_argument("--max-valid-mb", type=float, default=0.1)
    b.add_argument("--max-test-mb", type=float, default=0.1)
    b.add_argument("--valid-percent", type=int, default=5)
    b.add_argument("--test-percent", type=int, default=5)
    b.add_argument("--context-window", type=int, help="eval-lm's context (default: half of --tokens-per-sample)")
    b.add_argument("--seed", type=int, default=1)
    b.add_argument("--sp", action="store_true", help="also train with --sequence-parallel-size 2 (2 CPU processes)")
    b.add_argument("--native", action="store_true", help="also train fairseq's transformer_lm")
    add_training_options(b, max_update=200, warmup=100, max_tokens=2048, tokens_per_sample=512, log_interval=10)
    b.set_defaults(func=cmd_bytes, break_mode="none")
    a = ap.parse_args()
    if a.command == "bytes" and a.context_window is None:
        a.context_window = a.tokens_per_sample // 2
    a.func(a)


if __name__ == "__main__":
    main()
