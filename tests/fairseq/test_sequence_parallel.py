"""Sequence parallelism against the single-process run (issue: ls_transformer over P ranks).

Every rank builds the same model (float64, all dropouts 0.1) and batches. It computes the unsharded
reference itself (one process, the DP batches summed), then its sharded share through the criterion;
the world all-reduce of the shares (what fairseq's DDP does) must give the reference's summed loss,
nll, counts and every gradient to 1e-9 relative (support.sp, shared with the other families' SP tests).
Ranks run over gloo on the CPU: 2 processes (P=2) and 4 (P=4, and 2 SP x 2 DP with different batches),
one spawn per world size for all configurations.
"""
import argparse

import pytest
import torch

from support.dist import run
from support.models import batch, make_task, perturb_
from support.sp import assert_sharded_equals_one_process

CONFIGS = {
    "base": {},
    "pre_ln": dict(encoder_normalize_before=True, decoder_normalize_before=True),
    "shared_learned_lnemb": dict(share_all_embeddings=True, encoder_learned_pos=True, decoder_learned_pos=True,
                                 layernorm_embedding=True),
    "checkpoint_activations": dict(checkpoint_activations=True),
}
# (S, T): neither a multiple of P; with P = 4, S = 5 leaves rank 3 two padding rows only; T = 3 < P.
SHAPES = ((7, 5), (5, 3))


def _model(cfg, P, mode):
    from fairseq_lightseq.models.ls_transformer import LSTransformerModel
    from support.models import TINY

    task = make_task(joined=True)
    args = argparse.Namespace(**{**TINY, "dropout": 0.1, "attention_dropout": 0.1, "activation_dropout": 0.1,
                                 **CONFIGS[cfg]})
    torch.manual_seed(0)
    model = perturb_(LSTransformerModel.build_model(args, task), 0).double()
    return task, model


def _sample(task, dp_index, S, T):
    src, lengths, prev = batch(task, B=3, S=S, T=T, seed=10 + dp_index)
    target = torch.cat([prev[:, 1:], torch.full_like(prev[:, :1], task.target_dictionary.pad())], 1)
    target[:, -1] = torch.where(prev[:, -1].ne(task.target_dictionary.pad()), task.target_dictionary.eos(),
                                target[:, -1])
    return {"net_input": {"src_tokens": src, "src_lengths": lengths, "prev_output_tokens": prev},
            "target": target, "ntokens": int(target.ne(task.target_dictionary.pad()).sum())}


def _attach(model, sp):
    model.encoder.sequence_parallel = model.decoder.sequence_parallel = sp


def _check_config(cfg, P, mode, S, T, train=True):
    from fairseq_lightseq.criterions.ls_label_smoothed_cross_entropy import LsLabelSmoothedCrossEntropyCriterion

    task, model = _model(cfg, P, mode)
    criterion = LsLabelSmoothedCrossEntropyCriterion(task, False, 0.1, report_accuracy=True)
    assert_sharded_equals_one_process(model, _attach, criterion, lambda d: _sample(task, d, S, T), P, mode,
                                      f"{cfg} P={P} {mode} S={S} T={T} train={train}",
                                      ("loss", "nll_loss", "ntokens", "nsentences"), train=train)


def _all_configs(sizes):
    for P in sizes:
        for mode in ("ulysses", "allgather"):
            for cfg in CONFIGS:
                for S, T in SHAPES:
                    _check_config(cfg, P, mode, S, T)
            _check_config("base", P, mode, 7, 5, train=False)  # eval mode: no dropout, still sharded


@pytest.mark.parametrize("world,sizes", [(2, (2,)), (4, (4, 2))], ids=["world2_P2", "world4_P4_and_2x2"])
def test_sharded_equals_one_process(world, sizes):
    run(_all_configs, world, sizes, timeout=600)


def _layer_volumes(sizes):
    """Bytes one encoder layer's self-attention sends per rank, forward and backward (§2's table, with
    N = T_pad * B rows, E the width, float64): ulysses 4NE(P-1)/P^2, allgather 2NE(P-1)/P."""
    from fairseq_lightseq.modules import LSTransformerEncoderLayer
    from fairseq_lightseq.sequence_parallel.collectives import bytes_sent, reset_bytes
    from fairseq_lightseq.sequence_parallel.groups import new_sequence_parallel_group
    from fairseq_lightseq.sequence_parallel.sharding import SequenceParallel

    E, H, B, T = 16, 4, 3, 11
    for P in sizes:
        g = new_sequence_parallel_group(P)
        for mode, expected in (("ulysses", lambda N: 4 * N * E * (P - 1) // P ** 2),
                               ("allgather", lambda N: 2 * N * E * (P - 1) // P)):
            torch.manual_seed(0)
            layer = LSTransformerEncoderLayer(E, H, 24, dropout=0.1, attention_dropout=0.1).double()
            shard = SequenceParallel(g.group, P, g.rank, mode).shard(T)
            x = torch.randn(shard.rows, B, E, dtype=torch.float64, requires_grad=True)
            mask = torch.zeros(B, shard.padded, dtype=torch.bool)
            reset_bytes()
            layer(x, encoder_padding_mask=mask, shard=shard).sum().backward()
            N = shard.padded * B
            got = (bytes_sent("forward"), bytes_sent("backward"))
            assert got == (8 * expected(N),) * 2, (mode, P, got, 8 * expected(N))


@pytest.mark.parametrize("world,sizes", [(2, (2,)), (4, (4, 2))], ids=["world2_P2", "world4_P4_P2"])
def test_bytes_sent_per_layer_match_the_volume_formulas(world, sizes):
    run(_layer_volumes, world, sizes)
