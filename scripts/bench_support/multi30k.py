"""Multi30k En-De (train.en.gz / train.de.gz: one raw sentence a line, 29k pairs) binarized once by
fairseq-preprocess into the benchmark's cache, for `benchmark.py --packed`'s real batches.

Tokens: each line split into words and punctuation marks (`\\w+|[^\\w\\s]`, case kept), joined by spaces:
fairseq's whitespace tokens, no BPE. Three data-bins under one cache folder (named after the corpus'
path, sizes and times, so another corpus never reuses it):
    translation/   en -> de, --joined-dictionary (for --share-all-embeddings) of the JOINED_WORDS most
                   frequent tokens of both sides (the rest are <unk>: 2% of the English, 4% of the German
                   tokens; all of Multi30k's ~25k joined types would make the output projection most of a
                   small model's step)
    lm/            the English side, --only-source (dict.txt, train.bin/.idx): language_modeling
    sentence/      sentence_prediction: input0/ = lm/'s files, label/ = one class a sentence, 1 when it has
                   more tokens than the median sentence, else 0 (about half each)
The corpus itself is read from its folder (--multi30k) and never copied; the cache holds the tokenized
text only while fairseq-preprocess runs.
"""
import gzip
import hashlib
import os
import re
import shutil
import statistics

from .corpus import cached

FILES = ("train.en.gz", "train.de.gz")
TOKEN = re.compile(r"\w+|[^\w\s]")
JOINED_WORDS = 10000


def check_dir(path: str) -> str:
    """The absolute corpus folder; ValueError naming --multi30k if a train file is missing."""
    path = os.path.abspath(path)
    missing = [f for f in FILES if not os.path.isfile(os.path.join(path, f))]
    if missing:
        raise ValueError(f"--multi30k {path}: no {', '.join(missing)} there (the Multi30k En-De training "
                         f"text, one gzipped sentence a line: {', '.join(FILES)})")
    return path


def _key(path: str) -> str:
    st = [os.stat(os.path.join(path, f)) for f in FILES]
    return hashlib.sha1(repr((path, [(s.st_size, s.st_mtime_ns) for s in st])).encode()).hexdigest()[:12]


def _tokenize(src: str, dst: str) -> list:
    """Writes src (gzipped text) as space-separated tokens to dst; returns the token counts per line."""
    counts = []
    with gzip.open(src, "rt", encoding="utf-8") as f, open(dst, "w", encoding="utf-8") as g:
        for line in f:
            toks = TOKEN.findall(line)
            counts.append(len(toks))
            g.write(" ".join(toks) + "\n")
    return counts


def _preprocess(*args) -> None:
    """fairseq-preprocess ARGS in this process (fairseq is imported already: no start-up per call), its log
    file handler removed afterwards."""
    import logging

    from fairseq_cli import preprocess

    log = logging.getLogger(preprocess.__name__)
    before = list(log.handlers)
    try:
        preprocess.main(preprocess.options.get_preprocessing_parser().parse_args(
            ["--dataset-impl", "mmap", "--workers", "1", *args]))
    finally:
        for h in log.handlers[len(before):]:
            log.removeHandler(h)
            h.close()


def data_bins(corpus_dir: str, cache_dir: str) -> dict:
    """{"translation", "lm", "sentence"}: the data-bins' paths (made on first use, then reused)."""
    corpus_dir = check_dir(corpus_dir)

    def make(tmp):
        text = os.path.join(tmp, "text")
        os.makedirs(text)
        counts = {}
        for lang in ("en", "de"):
            counts[lang] = _tokenize(os.path.join(corpus_dir, f"train.{lang}.gz"), os.path.join(text, f"train.{lang}"))
        if len(counts["en"]) != len(counts["de"]):
            raise ValueError(f"--multi30k {corpus_dir}: train.en.gz has {len(counts['en'])} lines, train.de.gz "
                             f"{len(counts['de'])}: not sentence pairs")
        _preprocess("--source-lang", "en", "--target-lang", "de", "--joined-dictionary", "--nwordssrc",
                    str(JOINED_WORDS), "--trainpref", os.path.join(text, "train"), "--destdir",
                    os.path.join(tmp, "translation"))
        _preprocess("--only-source", "--trainpref", os.path.join(text, "train.en"), "--destdir",
                    os.path.join(tmp, "lm"))
        median = statistics.median(counts["en"])
        labels = os.path.join(text, "labels")
        with open(labels, "w") as f:
            f.writelines(f"{int(n > median)}\n" for n in counts["en"])
        _preprocess("--only-source", "--trainpref", labels, "--destdir", os.path.join(tmp, "sentence", "label"))
        shutil.copytree(os.path.join(tmp, "lm"), os.path.join(tmp, "sentence", "input0"))
        shutil.rmtree(text)

    d = cached(cache_dir, f"multi30k-{_key(corpus_dir)}-joined{JOINED_WORDS}", make)
    return {name: os.path.join(d, name) for name in ("translation", "lm", "sentence")}
