"""Helpers for the scripts that drive fairseq's command line (the demo, examples/language_model):
progress headings, running a command with its output streamed, finding a corpus's split files."""
import glob
import gzip
import os
import subprocess
import sys
import time


def step(msg):
    print(f"\n=== [{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run(args, log=None, show=None, env=None):
    """Runs a command, streaming its output (the lines `show(line)` accepts, all by default) and
    teeing all of it to `log`; fails loudly. Returns the output."""
    print("$ " + " ".join(args), flush=True)
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) as p:
        lines = []
        for line in p.stdout:
            lines.append(line)
            if "tensorboardX" not in line and (show is None or show(line)):
                sys.stdout.write(line)
                sys.stdout.flush()
        p.wait()
    if log:
        with open(log, "w") as f:
            f.writelines(lines)
    if p.returncode != 0:
        if show is not None:  # the lines left out may hold the error
            sys.stdout.writelines(lines[-40:])
        sys.exit(f"command failed with exit code {p.returncode}: {' '.join(args)}")
    return "".join(lines)


def find_split(data, split_names, lang):
    """The file of one split in a corpus directory: NAME.LANG, NAME_*.LANG (e.g. Multi30k's
    test_2016_flickr.en), optionally .gz, for the first NAME of `split_names` that has one."""
    for name in split_names:
        for pat in (f"{name}.{lang}", f"{name}.{lang}.gz", f"{name}_*.{lang}", f"{name}_*.{lang}.gz"):
            hits = sorted(glob.glob(os.path.join(data, pat)))
            if hits:
                return hits[0]
    raise SystemExit(f"no {'/'.join(split_names)} file for language {lang} in {data}")


# Our split names and the names corpora use for them.
SPLIT_NAMES = (("train", ["train"]), ("valid", ["valid", "val", "dev"]), ("test", ["test"]))


def open_text(path):
    """A text file or its .gz, for reading (UTF-8)."""
    return (gzip.open if path.endswith(".gz") else open)(path, "rt", encoding="utf-8")


def train_sentencepiece(inputs, model_prefix, vocab_size, model_type="unigram"):
    """Learns a sentencepiece model on the text files `inputs` (no BOS/EOS pieces: fairseq adds its own;
    every character kept; the vocabulary may come out smaller than `vocab_size` on a small corpus);
    writes model_prefix.model/.vocab and returns the loaded processor."""
    import sentencepiece as spm

    spm.SentencePieceTrainer.train(
        input=",".join(inputs), model_prefix=model_prefix, vocab_size=vocab_size, hard_vocab_limit=False,
        character_coverage=1.0, model_type=model_type, bos_id=-1, eos_id=-1, minloglevel=2,
        input_sentence_size=200000, shuffle_input_sentence=True)
    return spm.SentencePieceProcessor(model_file=model_prefix + ".model")


def encode_file(sp, src, dst):
    """Writes each line of `src` as its space-separated sentencepiece pieces into `dst`; returns
    (lines, whitespace-separated words) of `src`."""
    n_lines = n_words = 0
    with open(src, encoding="utf-8") as f, open(dst, "w", encoding="utf-8") as g:
        for line in f:
            n_lines += 1
            n_words += len(line.split())
            g.write(" ".join(sp.encode(line.strip(), out_type=str)) + "\n")
    return n_lines, n_words
