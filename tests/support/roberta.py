"""Builders for the RoBERTa tests: tiny fairseq `roberta` / `ls_roberta` pairs with the same weights
(classification heads too), masked-LM batches as fairseq's masked_lm task makes them, and the data-bins
of the command-line tests (`roberta_corpus_once`)."""
import os
import random

import torch

import fairseq_lightseq  # noqa: F401  (registers ls_roberta)
from fairseq.models.roberta import RobertaModel
from fairseq_lightseq.models.ls_roberta import LSRobertaModel

from .cli import run
from .models import FakeTask, arch_args, make_dict, pair_with_heads, perturb_

TINY_ROBERTA = dict(encoder_embed_dim=16, encoder_ffn_embed_dim=24, encoder_layers=2, encoder_attention_heads=4,
                    dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, max_positions=32)


def make_mlm_task(size: int = 37) -> FakeTask:
    """A joined dictionary with fairseq's masked_lm <mask> symbol (the last one)."""
    d = make_dict(size)
    d.add_symbol("<mask>")
    return FakeTask(d, d)


def build_roberta(cls, task, arch: str = "roberta", **overrides):
    """cls: RobertaModel or LSRobertaModel; arch: fairseq's name (ls_ is added for ours); TINY_ROBERTA
    and `overrides` set before the arch function, as on the command line."""
    if cls is LSRobertaModel:
        arch = "ls_" + arch
    return cls.build_model(arch_args(TINY_ROBERTA, arch, **overrides), task)


def perturb_roberta_(model, seed=0):
    """Random values everywhere (biases and norms too), the pad rows of the embeddings kept at zero."""
    return perturb_(model, seed, [model.encoder.sentence_encoder])


def roberta_pair(task=None, arch: str = "roberta", seed=0, heads=(), **overrides):
    """(fairseq roberta, ls_roberta) with identical random weights, in train mode; heads: (name,
    num_classes) classification heads registered on both."""
    task = task or make_mlm_task()
    return pair_with_heads([lambda cls=cls: build_roberta(cls, task, arch, **overrides)
                            for cls in (RobertaModel, LSRobertaModel)], seed, heads, perturb_roberta_)


def mlm_batch(task, B=3, T=9, seed=1, mask_every=3, pad=True):
    """(tokens, target) [B, T] int64 as fairseq's masked_lm task gives them: <s> w.. </s>, right padded
    (row b shorter by 2b when pad); every mask_every-th real word replaced by <mask> (0: none), the
    target holding the original word there and pad elsewhere."""
    d = task.source_dictionary
    mask = d.index("<mask>")
    g = torch.Generator().manual_seed(seed)
    tokens = torch.full((B, T), d.pad())
    target = torch.full((B, T), d.pad())
    for b in range(B):
        n = max(3, T - 2 * b) if pad else T
        row = torch.randint(d.nspecial, mask, (n,), generator=g)
        row[0], row[-1] = d.bos(), d.eos()
        tokens[b, :n] = row
        if mask_every:
            for i in range(1 + b % mask_every, n - 1, mask_every):
                target[b, i], tokens[b, i] = row[i], mask
    return tokens, target


def mlm_sample(task, **kw):
    tokens, target = mlm_batch(task, **kw)
    return {"net_input": {"src_tokens": tokens, "src_lengths": tokens.ne(1).sum(1)}, "target": target,
            "ntokens": int(tokens.ne(1).sum()), "nsentences": tokens.size(0)}


WORDS = "cat dog sat ran on under mat log big small red old".split()


def _chars(sentence):
    """What fairseq's `characters` BPE makes of a sentence (the hub interface encodes the same way)."""
    from fairseq.data.encoders.characters import Characters

    return Characters.encode(sentence)


def _write_corpus(d):
    """d/{train,valid,test}.txt (characters), d/labels.{split} (1 if the sentence starts with 'the'), and
    d/regression.{split} (its number of words / 10)."""
    rng = random.Random(0)
    for split, n in (("train", 300), ("valid", 30), ("test", 20)):
        sents = [" ".join([rng.choice(["the", "a"])] + rng.choices(WORDS, k=rng.randint(2, 6))) for _ in range(n)]
        with open(os.path.join(d, f"{split}.txt"), "w") as f:
            f.writelines(_chars(s) + "\n" for s in sents)
        with open(os.path.join(d, f"labels.{split}"), "w") as f:
            f.writelines(("1" if s.startswith("the ") else "0") + "\n" for s in sents)
        with open(os.path.join(d, f"regression.{split}"), "w") as f:
            f.writelines(f"{len(s.split()) / 10}\n" for s in sents)


def make_roberta_corpus(d: str) -> str:
    """Sentences of 3 to 7 words over 14, written in characters (fairseq's `characters` BPE, so the hub's
    encode needs no model file), binarised into the pretraining data-bin d/mlm and the fine-tuning one
    d/ft (input0 with the same dictionary, label: classes, label/{split}.label: regression targets);
    returns d."""
    _write_corpus(d)
    run(["fairseq-preprocess", "--only-source", "--trainpref", "train.txt", "--validpref", "valid.txt",
         "--testpref", "test.txt", "--destdir", "mlm", "--workers", "1"], cwd=d)
    run(["fairseq-preprocess", "--only-source", "--trainpref", "train.txt", "--validpref", "valid.txt",
         "--destdir", "ft/input0", "--srcdict", "mlm/dict.txt", "--workers", "1"], cwd=d)
    run(["fairseq-preprocess", "--only-source", "--trainpref", "labels.train", "--validpref", "labels.valid",
         "--destdir", "ft/label", "--workers", "1"], cwd=d)
    for split in ("train", "valid"):
        with open(os.path.join(d, f"regression.{split}")) as f, open(os.path.join(d, f"ft/label/{split}.label"), "w") as g:
            g.write(f.read())
    return d


_CORPUS = {}


def roberta_corpus_once(tmp_path_factory) -> str:
    """make_roberta_corpus once per session, for every module that uses it (each run writes its own
    --save-dir under it)."""
    if "d" not in _CORPUS:
        _CORPUS["d"] = make_roberta_corpus(str(tmp_path_factory.mktemp("roberta")))
    return _CORPUS["d"]


def sentence_prediction_argv(corpus: str, updates: int, *extra: str) -> list:
    """fairseq-train's arguments for a tiny ls_roberta sentence_prediction fine-tune (fairseq's own criterion) on
    roberta_corpus_once's corpus, `updates` updates, every update's loss logged; `extra` appended (no --save-dir)."""
    from .cli import USER_DIR

    return [os.path.join(corpus, "ft"), "--task", "sentence_prediction", "--user-dir", USER_DIR, "--arch",
            "ls_roberta", "--optimizer", "ls_adam", "--criterion", "sentence_prediction", "--num-classes", "2",
            "--init-token", "0", "--separator-token", "2", "--max-positions", "64", "--encoder-layers", "1",
            "--encoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2",
            "--batch-size", "8", "--lr", "0.002", "--seed", "1", "--cpu", "--num-workers", "0", "--max-update",
            str(updates), "--log-format", "json", "--log-interval", "1", *extra]
