"""Builders for the language-model tests: tiny fairseq `transformer_lm` / `ls_transformer_lm` pairs with
the same weights, and right-padded token blocks as fairseq's language_modeling task makes them."""
import argparse

import torch

import fairseq_lightseq  # noqa: F401  (registers ls_transformer_lm)
from fairseq.models.transformer_lm import TransformerLanguageModel
from fairseq_lightseq.models.ls_transformer_lm import LSTransformerLanguageModel

from .models import arch_args, make_task, perturb_

TINY_LM = dict(decoder_embed_dim=16, decoder_ffn_embed_dim=24, decoder_layers=2, decoder_attention_heads=4,
               dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, tokens_per_sample=64)


def lm_args(arch: str = "transformer_lm", **overrides) -> argparse.Namespace:
    """The namespace fairseq-train makes for --arch `arch` (fairseq's arch function applied) with
    TINY_LM and `overrides` set first, as on the command line."""
    # fairseq's own --arch transformer_lm takes its dataclass's defaults (no arch function): ours sets the same
    return arch_args(TINY_LM, "ls_transformer_lm" if arch == "transformer_lm" else arch, **overrides)


def build_lm(cls, task, arch: str = "transformer_lm", **overrides):
    """cls: TransformerLanguageModel or LSTransformerLanguageModel; arch: fairseq's name (ls_ is added for ours)."""
    if cls is LSTransformerLanguageModel:
        arch = "ls_" + arch
    return cls.build_model(lm_args(arch, **overrides), task)


def perturb_lm_(model, seed=0):
    """Random values everywhere (biases and norms too), the pad rows of the embeddings kept at zero."""
    return perturb_(model, seed, [model.decoder])


def lm_pair(task=None, arch: str = "transformer_lm", seed=0, **overrides):
    """(fairseq transformer_lm, ls_transformer_lm) with identical random weights, in train mode."""
    task = task or make_task()
    torch.manual_seed(seed)
    ref = perturb_lm_(build_lm(TransformerLanguageModel, task, arch, **overrides), seed)
    ours = build_lm(LSTransformerLanguageModel, task, arch, **overrides)
    ours.load_state_dict(ref.state_dict(), strict=True)
    return ref, ours


def lm_batch(task, B=3, T=9, seed=1, pad=True):
    """tokens [B, T] int64, right padded (row b shorter by 2b when pad), and the target: the next token,
    pad after each row's last token (as fairseq's MonolingualDataset with --sample-break-mode eos)."""
    d = task.source_dictionary
    g = torch.Generator().manual_seed(seed)
    tokens = torch.full((B, T), d.pad())
    target = torch.full((B, T), d.pad())
    for b in range(B):
        n = max(1, T - 2 * b) if pad else T
        row = torch.randint(d.nspecial, len(d), (n + 1,), generator=g)
        tokens[b, :n], target[b, :n] = row[:-1], row[1:]
    return tokens, target
