"""Builders for the RoBERTa tests: tiny fairseq `roberta` / `ls_roberta` pairs with the same weights
(classification heads too), and masked-LM batches as fairseq's masked_lm task makes them."""
import torch

import fairseq_lightseq  # noqa: F401  (registers ls_roberta)
from fairseq.models.roberta import RobertaModel
from fairseq_lightseq.models.ls_roberta import LSRobertaModel

from .models import FakeTask, arch_args, make_dict, perturb_

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
    torch.manual_seed(seed)
    models = []
    for cls in (RobertaModel, LSRobertaModel):
        m = build_roberta(cls, task, arch, **overrides)
        for name, n in heads:
            m.register_classification_head(name, num_classes=n)
        models.append(m)
    ref, ours = models
    perturb_roberta_(ref, seed)
    ours.load_state_dict(ref.state_dict(), strict=True)
    return ref, ours


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
