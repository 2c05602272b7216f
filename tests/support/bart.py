"""Builders for the BART tests: tiny fairseq `bart` / `ls_bart` pairs with the same weights (classification
heads too), sentence-classification batches as fairseq's sentence_prediction task gives BART (every row
ends with </s>, the decoder reads the row shifted right)."""
import torch

import fairseq_lightseq  # noqa: F401  (registers ls_bart)
from fairseq.models.bart import BARTModel
from fairseq_lightseq.models.ls_bart import LSBARTModel

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
