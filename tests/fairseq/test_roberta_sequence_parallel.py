"""Sequence parallelism of the encoder-only model (ls_roberta + ls_masked_lm) against the single-process
run, with support.sp's check (the one the translation model's test runs): float64, all dropouts 0.1,
bidirectional attention, both exchange modes; the all-reduced shares of loss, ntokens, nsentences,
sample_size (the masked count) and every gradient equal the one-process values to 1e-9 relative. Also
--max-positions beyond 512 with learned positions (T = 530). Ranks over gloo on the CPU: 2 processes
(P=2), and 4 for P=4 and 2 SP x 2 DP on the base config."""
import pytest
import torch

from support.dist import run
from support.roberta import build_roberta, make_mlm_task, mlm_sample, perturb_roberta_
from support.sp import assert_sharded_equals_one_process

DROPOUTS = dict(dropout=0.1, attention_dropout=0.1, activation_dropout=0.1)
CONFIGS = {
    "roberta": {},
    "prenorm_untied": dict(arch="roberta_prenorm", untie_weights_roberta=True),
    "checkpoint_activations": dict(checkpoint_activations=True),
    "long_inputs": dict(max_positions=600),
}
# T per config: 9 is no multiple of P (with P = 4 the last rank holds padding only past row 9 of 12)
LENGTHS = {"long_inputs": 530}


def _attach(model, sp):
    model.encoder.sentence_encoder.sequence_parallel = sp


def _check(cfg, P, mode, train=True):
    from fairseq_lightseq.criterions.ls_masked_lm import LsMaskedLmConfig, LsMaskedLmLoss
    from fairseq_lightseq.models.ls_roberta import LSRobertaModel

    task = make_mlm_task()
    overrides = dict(CONFIGS[cfg])
    torch.manual_seed(0)
    model = perturb_roberta_(build_roberta(LSRobertaModel, task, **{**DROPOUTS, **overrides}), 0).double()
    T = LENGTHS.get(cfg, 9)
    B = 2 if T > 100 else 3
    assert_sharded_equals_one_process(
        model, _attach, LsMaskedLmLoss(LsMaskedLmConfig(tpu=False), task),
        lambda d: mlm_sample(task, B=B, T=T, seed=10 + d), P, mode, f"{cfg} P={P} {mode} T={T} train={train}",
        ("loss", "ntokens", "nsentences"), train=train)


def _all(configs, sizes):
    for P in sizes:
        for mode in ("ulysses", "allgather"):
            for cfg in configs:
                _check(cfg, P, mode)
            _check(configs[0], P, mode, train=False)


@pytest.mark.parametrize("world,configs,sizes", [(2, list(CONFIGS), (2,)), (4, ["roberta"], (4, 2))],
                         ids=["world2_P2", "world4_P4_and_2x2"])
def test_sharded_equals_one_process(world, configs, sizes):
    run(_all, world, configs, sizes, timeout=300)
