"""Builders shared by the model tests: tiny fairseq `transformer` / `ls_transformer` pairs with the
same weights, and padded batches."""
import argparse

import torch

import fairseq_lightseq  # noqa: F401  (registers ls_transformer)
from fairseq.data import Dictionary
from fairseq.models.transformer import TransformerModel
from fairseq_lightseq.models.ls_transformer import LSTransformerModel

TINY = dict(encoder_embed_dim=16, encoder_ffn_embed_dim=24, encoder_layers=2, encoder_attention_heads=4,
            decoder_layers=2, decoder_attention_heads=4, dropout=0.0, attention_dropout=0.0,
            activation_dropout=0.0)


class FakeTask:
    def __init__(self, src_dict, tgt_dict):
        self.source_dictionary = src_dict
        self.target_dictionary = tgt_dict


def make_dict(n: int) -> Dictionary:
    d = Dictionary()
    for i in range(n):
        d.add_symbol(f"w{i}")
    return d


def make_task(joined: bool = True, src_size: int = 37, tgt_size: int = 41) -> FakeTask:
    if joined:
        d = make_dict(src_size)
        return FakeTask(d, d)
    return FakeTask(make_dict(src_size), make_dict(tgt_size))


def build(cls, task, **overrides):
    args = argparse.Namespace(**{**TINY, **overrides})
    return cls.build_model(args, task)


def arch_args(defaults: dict, arch: str, **overrides) -> argparse.Namespace:
    """The namespace fairseq-train makes for --arch `arch` (its arch function applied) with `defaults`
    and `overrides` set first, as on the command line."""
    from fairseq.models import ARCH_CONFIG_REGISTRY

    args = argparse.Namespace(**{**defaults, **overrides})
    ARCH_CONFIG_REGISTRY[arch](args)
    return args


def perturb_(model, seed=0, stacks=None):
    """Random values everywhere (biases and norms too, which init to 0/1), pad rows kept at zero as
    fairseq's initialisation leaves them (and its padding_idx embeddings never update them).
    stacks: the modules holding embed_tokens/embed_positions (default: the encoder and the decoder)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=g))
        for m in stacks if stacks is not None else (model.encoder, model.decoder):
            m.embed_tokens.weight[m.padding_idx].zero_()
            pos = m.embed_positions
            if pos is not None and hasattr(pos, "weight"):
                pos.weight[m.padding_idx].zero_()
    return model


def pair_with_heads(builders, seed, heads, perturb):
    """(reference, ours) built by the two `builders` after torch.manual_seed(seed), each with the (name,
    num_classes) classification heads `heads`; perturb(reference, seed) applied and its weights loaded
    into ours. Both in train mode."""
    torch.manual_seed(seed)
    models = []
    for build_one in builders:
        m = build_one()
        for name, n in heads:
            m.register_classification_head(name, num_classes=n)
        models.append(m)
    ref, ours = models
    perturb(ref, seed)
    ours.load_state_dict(ref.state_dict(), strict=True)
    return ref, ours


def pair(task=None, seed=0, **overrides):
    """(fairseq transformer, ls_transformer) with identical random weights, both in train mode."""
    task = task or make_task()
    torch.manual_seed(seed)
    ref = perturb_(build(TransformerModel, task, **overrides), seed)
    ours = build(LSTransformerModel, task, **overrides)
    ours.load_state_dict(ref.state_dict(), strict=True)
    return ref, ours


def batch(task, B=3, S=7, T=5, seed=1, left_pad_source=True):
    """src_tokens [B, S] left padded (fairseq's default) with odd lengths, prev_output_tokens [B, T]
    right padded starting with eos, and src_lengths."""
    g = torch.Generator().manual_seed(seed)
    sd, td = task.source_dictionary, task.target_dictionary
    src = torch.full((B, S), sd.pad())
    tgt = torch.full((B, T), td.pad())
    for b in range(B):
        ls = S - (b * 2) % S if b else S
        lt = T - b % T if b else T
        ls, lt = max(ls, 1), max(lt, 1)
        toks = torch.randint(sd.nspecial, len(sd), (ls,), generator=g)
        if left_pad_source:
            src[b, S - ls:] = toks
        else:
            src[b, :ls] = toks
        tgt[b, :lt] = torch.randint(td.nspecial, len(td), (lt,), generator=g)
        tgt[b, 0] = td.eos()
    return src, src.ne(sd.pad()).sum(1), tgt
