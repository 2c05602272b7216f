"""Builders for the BART tests: tiny fairseq `bart` / `ls_bart` pairs with the same weights (classification
heads too), sentence-classification batches as fairseq's sentence_prediction task gives BART (every row
ends with </s>, the decoder reads the row shifted right), and the Multi30k data-bins of the command-line
tests (`mbart_data_once`)."""
import gzip
import os
import random
import re
import shutil

import torch

import fairseq_lightseq  # noqa: F401  (registers ls_bart)
from fairseq.models.bart import BARTModel
from fairseq_lightseq.models.ls_bart import LSBARTModel

from .cli import run
from .models import arch_args, make_task, pair_with_heads, perturb_

TINY_BART = dict(encoder_embed_dim=16, encoder_ffn_embed_dim=24, encoder_layers=2, encoder_attention_heads=4,
                 decoder_layers=2, decoder_attention_heads=4, dropout=0.0, attention_dropout=0.0,
                 activation_dropout=0.0, max_source_positions=32, max_target_positions=32, task="denoising")


def make_bart_task(size: int = 37):
    """A joined dictionary with the <mask> symbol BART's tasks add (the last one)."""
    task = make_task(src_size=size)
    task.source_dictionary.add_symbol("<mask>")
    return task


def build_bart(cls, task, arch: str = "mbart_base", **overrides):
    """cls: BARTModel or LSBARTModel; arch: fairseq's name (ls_ is added for ours); TINY_BART and
    `overrides` set before the arch function, as on the command line."""
    if cls is LSBARTModel:
        arch = "ls_" + arch
    return cls.build_model(arch_args(TINY_BART, arch, **overrides), task)


def bart_pair(task=None, arch: str = "mbart_base", seed=0, heads=(), **overrides):
    """(fairseq bart, ls_bart) with identical random weights, in train mode; heads: (name, num_classes)
    classification heads registered on both."""
    task = task or make_bart_task()
    return pair_with_heads([lambda cls=cls: build_bart(cls, task, arch, **overrides)
                            for cls in (BARTModel, LSBARTModel)], seed, heads, perturb_)


def classification_batch(task, B=3, T=8, seed=1):
    """(src_tokens [B, T] right padded, each row ending with </s>; src_lengths [B]; prev_output_tokens [B, T]:
    the row rotated right, </s> first), as fairseq's sentence_prediction task gives BART; rows shorter by 2b."""
    g = torch.Generator().manual_seed(seed)
    d = task.source_dictionary
    src = torch.full((B, T), d.pad())
    prev = torch.full((B, T), d.pad())
    for b in range(B):
        n = max(T - 2 * b, 2)
        row = torch.cat([torch.randint(d.nspecial, len(d) - 1, (n - 1,), generator=g), torch.tensor([d.eos()])])
        src[b, :n] = row
        prev[b, :n] = torch.roll(row, 1)
    return src, src.ne(d.pad()).sum(1), prev


# Multi30k En-De (raw text, one gzipped sentence a line), read where the repository's data lives; without
# it a corpus of the same shape is written (two small vocabularies), so the tests run anywhere.
MULTI30K = os.environ.get("FLS_MULTI30K", "/work/shared/data/multi30k")
SPLITS = (("train", "train", 300), ("valid", "val", 30), ("test", "test_2016_flickr", 12))
LANGS = ("en", "de")
TOKEN = re.compile(r"\w+|[^\w\s]")
STAND_IN = {"en": "a the dog cat man woman runs sits on under red small street".split(),
            "de": "ein der hund katze mann frau läuft sitzt auf unter rot klein straße".split()}


def _sentences(split: str, name: str, lang: str, n: int):
    """The first n sentences of Multi30k's `name` split in `lang`, tokenized (words and punctuation), or n
    stand-in sentences when the corpus is absent."""
    path = os.path.join(MULTI30K, f"{name}.{lang}.gz")
    if os.path.isfile(path):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return [" ".join(TOKEN.findall(line)) for line, _ in zip(f, range(n))]
    rng = random.Random(f"{split}.{lang}")
    return [" ".join(rng.choices(STAND_IN[lang], k=rng.randint(3, 12))) for _ in range(n)]


def make_mbart_data(d: str, words: int = 600) -> dict:
    """The data-bins of the mBART tests under d, one joined dictionary (the `words` most frequent tokens of
    both languages) for all: {"mono": d/mono (multilingual_denoising: dict.txt, en/ and de/ with train and
    valid), "en": d/mono/en (denoising: the English side with its dict.txt), "pair": d/pair (en -> de:
    dict.en.txt = dict.de.txt, train, valid, test)}."""
    raw = os.path.join(d, "raw")
    os.makedirs(raw)
    for split, name, n in SPLITS:
        for lang in LANGS:
            with open(os.path.join(raw, f"{split}.{lang}"), "w", encoding="utf-8") as f:
                f.writelines(s + "\n" for s in _sentences(split, name, lang, n))
    with open(os.path.join(raw, "both.txt"), "w", encoding="utf-8") as f:
        for lang in LANGS:
            f.write(open(os.path.join(raw, f"train.{lang}"), encoding="utf-8").read())
    run(["fairseq-preprocess", "--only-source", "--trainpref", "raw/both.txt", "--destdir", "dict",
         "--nwordssrc", str(words), "--workers", "1"], cwd=d)
    dictionary = os.path.join(d, "dict", "dict.txt")
    mono = os.path.join(d, "mono")
    for lang in LANGS:
        run(["fairseq-preprocess", "--only-source", "--srcdict", dictionary, "--trainpref", f"raw/train.{lang}",
             "--validpref", f"raw/valid.{lang}", "--destdir", f"mono/{lang}", "--workers", "1"], cwd=d)
    shutil.copy(dictionary, os.path.join(mono, "dict.txt"))  # each language's folder has its copy
    run(["fairseq-preprocess", "--source-lang", "en", "--target-lang", "de", "--srcdict", dictionary, "--tgtdict",
         dictionary, "--trainpref", "raw/train", "--validpref", "raw/valid", "--testpref", "raw/test",
         "--destdir", "pair", "--workers", "1"], cwd=d)
    return {"mono": mono, "en": os.path.join(mono, "en"), "pair": os.path.join(d, "pair")}


_DATA = {}


def mbart_data_once(tmp_path_factory) -> dict:
    """make_mbart_data, once per test session."""
    if "d" not in _DATA:
        _DATA["d"] = make_mbart_data(str(tmp_path_factory.mktemp("mbart_data")))
    return _DATA["d"]
