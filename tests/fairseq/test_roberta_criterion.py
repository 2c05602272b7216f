"""ls_masked_lm against fairseq's masked_lm on the same weights: loss, sample_size (the masked count),
logging output (keys and values) and gradients; a batch without masked tokens; validation (no grad);
fairseq's native roberta through the fused path; no [masked, V] logits kept for backward. And
fairseq's sentence_prediction criterion (classification, --regression-target) on ls_roberta."""
import pytest
import torch

from fairseq.criterions.masked_lm import MaskedLmConfig, MaskedLmLoss
from fairseq.criterions.sentence_prediction import SentencePredictionConfig, SentencePredictionCriterion
from fairseq_lightseq.criterions.ls_masked_lm import LsMaskedLmConfig, LsMaskedLmLoss

from support.parity import assert_grads_match, rel_err
from support.roberta import make_mlm_task, mlm_sample, roberta_pair


def _step(model, criterion, sample, backward=True):
    model.zero_grad()
    loss, sample_size, log = criterion(model, sample)
    if backward:
        loss.backward()
    return loss.detach(), sample_size, log, {n: p.grad.clone() for n, p in model.named_parameters()
                                             if p.grad is not None}


def _assert_same_step(ref_step, step, tol=1e-5):
    ref_loss, ref_size, ref_log, ref_g = ref_step
    loss, size, log, g = step
    assert int(size) == int(ref_size) and log.keys() == ref_log.keys()
    assert rel_err(loss, ref_loss) < tol and rel_err(log["loss"], ref_log["loss"]) < tol
    for key in ("ntokens", "nsentences", "sample_size"):
        assert int(log[key]) == int(ref_log[key]), key
    assert_grads_match(g, ref_g, 10 * tol)


@pytest.mark.parametrize("config", [{}, dict(untie_weights_roberta=True), dict(arch="roberta_prenorm")],
                         ids=["tied", "untied", "prenorm"])
def test_ls_masked_lm_matches_fairseq_masked_lm(config):
    task = make_mlm_task()
    ref, ours = roberta_pair(task, **config)
    sample = mlm_sample(task, B=4, T=11)
    ref_step = _step(ref, MaskedLmLoss(MaskedLmConfig(tpu=False), task), sample)
    step = _step(ours, LsMaskedLmLoss(LsMaskedLmConfig(tpu=False), task), sample)
    assert int(step[1]) == int(sample["target"].ne(1).sum()) > 0  # sample_size: the masked tokens
    _assert_same_step(ref_step, step)
    assert step[3]["encoder.lm_head.bias"].abs().sum() > 0  # the projection's bias gets its gradient


def test_batch_without_masked_tokens_gives_zero_loss_and_gradients():
    task = make_mlm_task()
    ref, ours = roberta_pair(task)
    sample = mlm_sample(task, mask_every=0)
    ref_step = _step(ref, MaskedLmLoss(MaskedLmConfig(tpu=False), task), sample)
    step = _step(ours, LsMaskedLmLoss(LsMaskedLmConfig(tpu=False), task), sample)
    assert float(step[0]) == 0 and int(step[1]) == 0 == int(ref_step[1])
    assert all(float(v.abs().max()) == 0 for v in step[3].values())
    assert all(float(v.abs().max()) == 0 for v in ref_step[3].values())


def test_validation_and_the_native_model_through_the_fused_path():
    task = make_mlm_task()
    ref, ours = roberta_pair(task)
    sample = mlm_sample(task, B=4, T=11)
    ref.eval(), ours.eval()
    with torch.no_grad():
        expected = MaskedLmLoss(MaskedLmConfig(tpu=False), task)(ref, sample)[0]
        assert rel_err(LsMaskedLmLoss(LsMaskedLmConfig(tpu=False), task)(ours, sample)[0], expected) < 1e-5
    ref.train()
    # fairseq's own RobertaLMHead takes the fused loss too (its modules transform, the op projects)
    _assert_same_step(_step(ref, MaskedLmLoss(MaskedLmConfig(tpu=False), task), sample),
                      _step(ref, LsMaskedLmLoss(LsMaskedLmConfig(tpu=False), task), sample))


def test_no_masked_by_vocabulary_logits_are_kept_for_backward():
    """What autograd saves for backward: no tensor with a V-sized last dim and one row per masked token."""
    task = make_mlm_task()
    _, ours = roberta_pair(task)
    sample = mlm_sample(task, B=4, T=11)
    V, M = len(task.source_dictionary), int(sample["target"].ne(1).sum())
    saved = []

    def pack(t):
        saved.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        LsMaskedLmLoss(LsMaskedLmConfig(tpu=False), task)(ours, sample)
    assert saved and (M, V) not in saved, saved
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        MaskedLmLoss(MaskedLmConfig(tpu=False), task)(ours, sample)
    assert (M, V) in saved  # fairseq's criterion keeps them (the check above is not vacuous)


class _LabelTask:
    def __init__(self, task, labels):
        self.source_dictionary = self.target_dictionary = task.source_dictionary
        self.label_dictionary = labels


@pytest.mark.parametrize("regression", [False, True], ids=["classification", "regression"])
def test_sentence_prediction_criterion_on_ls_roberta(regression):
    task = make_mlm_task()
    n = 1 if regression else 3
    ref, ours = roberta_pair(task, heads=(("sentence_classification_head", n),))
    sample = mlm_sample(task, B=4, T=9, mask_every=0)
    sample["target"] = (torch.tensor([[0.5], [-1.0], [2.0], [0.0]]) if regression else torch.tensor([[0], [2], [1], [2]]))
    cfg = SentencePredictionConfig(regression_target=regression)
    ref_step = _step(ref, SentencePredictionCriterion(cfg, _LabelTask(task, None)), sample)
    step = _step(ours, SentencePredictionCriterion(cfg, _LabelTask(task, None)), sample)
    if not regression:
        assert int(step[2]["ncorrect"]) == int(ref_step[2]["ncorrect"])
        del step[2]["ncorrect"], ref_step[2]["ncorrect"]
    _assert_same_step(ref_step, step)
