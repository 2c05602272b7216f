"""Sequence parallelism against the single-process run, for both model families: ls_transformer
(translation) and ls_transformer_lm (the decoder-only language model) over P ranks.

Every rank builds the same model (float64, all dropouts 0.1) and batches. It computes the unsharded
reference itself (one process, the DP batches summed), then its sharded share through the criterion;
the world all-reduce of the shares (what fairseq's DDP does) must give the reference's summed loss,
nll, counts and every gradient to 1e-9 relative (support.sp, shared with RoBERTa's SP tests). Ranks run over gloo on the CPU: 2 processes (P=2)
and 4 (P=4, and 2 SP x 2 DP with different batches), one spawn per world size for both families, all
their configurations and the bytes each layer sends.
"""
import argparse
from typing import Callable, Dict, NamedTuple, Tuple

import pytest
import torch

from support.dist import run
from support.models import TINY, make_task, perturb_
from support.sp import assert_sharded_equals_one_process, translation_sample

DROPOUTS = {"dropout": 0.1, "attention_dropout": 0.1, "activation_dropout": 0.1}


class Family(NamedTuple):
    """A model family under test: its configurations (arch overrides), shapes, and builders of the
    model, a data-parallel shard's sample and the criterion."""

    configs: Dict[str, dict]
    shapes: Tuple[tuple, ...]
    model: Callable  # (cfg name) -> (task, float64 model)
    sample: Callable  # (task, dp_index, shape) -> fairseq sample
    criterion: Callable  # (task) -> criterion


def _translation_model(cfg):
    from fairseq_lightseq.models.ls_transformer import LSTransformerModel

    task = make_task(joined=True)
    args = argparse.Namespace(**{**TINY, **DROPOUTS, **TRANSLATION.configs[cfg]})
    torch.manual_seed(0)
    return task, perturb_(LSTransformerModel.build_model(args, task), 0).double()


def _translation_criterion(task):
    from fairseq_lightseq.criterions.ls_label_smoothed_cross_entropy import LsLabelSmoothedCrossEntropyCriterion

    return LsLabelSmoothedCrossEntropyCriterion(task, False, 0.1, report_accuracy=True)


# (S, T): neither a multiple of P; with P = 4, S = 5 leaves rank 3 two padding rows only; T = 3 < P.
TRANSLATION = Family(
    configs={
        "base": {},
        "pre_ln": dict(encoder_normalize_before=True, decoder_normalize_before=True),
        "shared_learned_lnemb": dict(share_all_embeddings=True, encoder_learned_pos=True, decoder_learned_pos=True,
                                     layernorm_embedding=True),
        "checkpoint_activations": dict(checkpoint_activations=True),
    },
    shapes=((7, 5), (5, 3)), model=_translation_model, sample=translation_sample, criterion=_translation_criterion)

def _lm_model(cfg):
    from fairseq_lightseq.models.ls_transformer_lm import LSTransformerLanguageModel
    from support.lm import build_lm, perturb_lm_

    task = make_task(joined=True)
    torch.manual_seed(0)
    model = build_lm(LSTransformerLanguageModel, task, **DROPOUTS, **LM.configs[cfg])
    return task, perturb_lm_(model, 0).double()


def _lm_sample(task, dp_index, shape):
    """The language_modeling task's sample: B = 3 blocks of T tokens, right padded as
    --sample-break-mode complete/eos pads them (row 0 full, as every --sample-break-mode none block),
    net_input {src_tokens, src_lengths}, target the next tokens."""
    from support.lm import lm_batch

    (T,) = shape
    tokens, target = lm_batch(task, B=3, T=T, seed=20 + dp_index)
    pad = task.source_dictionary.pad()
    return {"net_input": {"src_tokens": tokens, "src_lengths": tokens.ne(pad).sum(1)}, "target": target,
            "ntokens": int(target.ne(pad).sum())}


def _lm_criterion(task):
    from fairseq_lightseq.criterions.ls_cross_entropy import LsCrossEntropyCriterion

    return LsCrossEntropyCriterion(task, False)


# T: 7 (not a multiple of P), 3 (< P = 4: rank 3 holds padding rows only)
LM = Family(
    configs={
        "base": {},
        "pre_ln": dict(decoder_normalize_before=True),
        "shared_learned_lnemb": dict(share_decoder_input_output_embed=True, decoder_learned_pos=True,
                                     layernorm_embedding=True),
        "checkpoint_activations": dict(checkpoint_activations=True),
    },
    shapes=((7,), (3,)), model=_lm_model, sample=_lm_sample, criterion=_lm_criterion)

FAMILIES = {"translation": TRANSLATION, "lm": LM}


def _stacks(model):
    """The encoder (if any) and the decoder: the modules that take a SequenceParallel."""
    return [m for m in (getattr(model, "encoder", None), model.decoder) if m is not None]


def _check_config(family, cfg, P, mode, shape, train=True):
    """Asserts this rank's share, all-reduced, equals the single-process run (support.sp); returns the
    largest relative error of a gradient."""
    fam = FAMILIES[family]
    task, model = fam.model(cfg)

    def attach(m, sp):
        for stack in _stacks(m):
            stack.sequence_parallel = sp

    # ls_cross_entropy logs no nll_loss (fairseq's cross_entropy derives it)
    log_keys = ("loss", "nll_loss", "ntokens", "nsentences") if family == "translation" else ("loss", "ntokens",
                                                                                              "nsentences")
    return assert_sharded_equals_one_process(model, attach, fam.criterion(task), lambda d: fam.sample(task, d, shape),
                                             P, mode, f"{family} {cfg} P={P} {mode} shape={shape} train={train}",
                                             log_keys, train=train)


def _all_configs(family, sizes):
    """Every configuration, shape and mode at each P; returns the largest relative gradient error."""
    fam, worst = FAMILIES[family], 0.0
    for P in sizes:
        for mode in ("ulysses", "allgather"):
            for cfg in fam.configs:
                for shape in fam.shapes:
                    worst = max(worst, _check_config(family, cfg, P, mode, shape))
            # eval mode: no dropout, still sharded
            worst = max(worst, _check_config(family, "base", P, mode, fam.shapes[0], train=False))
    return worst


def _layer_volumes(sizes):
    """Bytes one layer's self-attention sends per rank, forward and backward (§2's table, with N =
    T_pad * B rows, E the width, float64): ulysses 4NE(P-1)/P^2, allgather 2NE(P-1)/P; the same for an
    encoder layer and for the language model's decoder layer (causal, no cross-attention: allgather
    gathers all keys and values, then drops those past the rank's last row)."""
    from fairseq_lightseq.modules import LSTransformerDecoderLayer, LSTransformerEncoderLayer
    from fairseq_lightseq.sequence_parallel.collectives import bytes_sent, reset_bytes
    from fairseq_lightseq.sequence_parallel.groups import new_sequence_parallel_group
    from fairseq_lightseq.sequence_parallel.sharding import SequenceParallel

    E, H, B, T = 16, 4, 3, 11
    kw = dict(dropout=0.1, attention_dropout=0.1)
    for P in sizes:
        g = new_sequence_parallel_group(P)
        for mode, expected in (("ulysses", lambda N: 4 * N * E * (P - 1) // P ** 2),
                               ("allgather", lambda N: 2 * N * E * (P - 1) // P)):
            for kind in ("encoder", "lm_decoder"):
                torch.manual_seed(0)
                shard = SequenceParallel(g.group, P, g.rank, mode).shard(T)
                x = torch.randn(shard.rows, B, E, dtype=torch.float64, requires_grad=True)
                mask = torch.zeros(B, shard.padded, dtype=torch.bool)
                reset_bytes()
                if kind == "encoder":
                    layer = LSTransformerEncoderLayer(E, H, 24, **kw).double()
                    y = layer(x, encoder_padding_mask=mask, shard=shard)
                else:
                    layer = LSTransformerDecoderLayer(E, H, 24, no_encoder_attn=True, **kw).double()
                    y = layer(x, None, None, None, self_attn_padding_mask=mask, causal=True, shard=shard)[0]
                y.sum().backward()
                N = shard.padded * B
                got = (bytes_sent("forward"), bytes_sent("backward"))
                assert got == (8 * expected(N),) * 2, (kind, mode, P, got, 8 * expected(N))


def _world_checks(sizes):
    """In one spawn of the ranks: every family's configurations at each P of `sizes` (`_all_configs`) and
    the bytes sent per layer (`_layer_volumes`); returns {family: largest relative gradient error}."""
    worst = {family: _all_configs(family, sizes) for family in FAMILIES}
    _layer_volumes(sizes)
    return worst


@pytest.mark.parametrize("world,sizes", [(2, (2,)), (4, (4, 2))], ids=["world2_P2", "world4_P4_and_2x2"])
def test_sharded_equals_one_process_and_bytes_sent_match_the_volume_formulas(world, sizes):
    results = run(_world_checks, world, sizes, timeout=600)
    for family in FAMILIES:
        print(f"{family} world {world}: largest relative gradient error {max(r[family] for r in results):.3g}")
