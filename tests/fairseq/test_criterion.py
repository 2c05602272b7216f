"""ls_label_smoothed_cross_entropy against fairseq's label_smoothed_cross_entropy on the same tiny
fairseq transformer and batch: same loss, nll_loss, accuracy counts, sample size, gradients, metrics."""
import argparse
import copy

import pytest
import torch
from fairseq.criterions import CRITERION_REGISTRY
from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion
from fairseq.data import Dictionary
from fairseq.logging import metrics
from fairseq.models.transformer import TransformerModel, base_architecture

import fairseq_lightseq  # noqa: F401  (registers the criterion)
from fairseq_lightseq.criterions.ls_label_smoothed_cross_entropy import LsLabelSmoothedCrossEntropyCriterion


class _Task:
    def __init__(self, d):
        self.source_dictionary = d
        self.target_dictionary = d


def _model_and_sample(seed=0, vocab=29, B=3, T=6, S=5):
    torch.manual_seed(seed)
    d = Dictionary()
    for i in range(vocab):
        d.add_symbol(f"w{i}")
    args = argparse.Namespace(encoder_embed_dim=16, encoder_ffn_embed_dim=32, encoder_layers=1,
                              encoder_attention_heads=2, decoder_embed_dim=16, decoder_ffn_embed_dim=32,
                              decoder_layers=1, decoder_attention_heads=2, dropout=0.0, attention_dropout=0.0,
                              activation_dropout=0.0, share_decoder_input_output_embed=False,
                              max_source_positions=64, max_target_positions=64)
    base_architecture(args)
    task = _Task(d)
    model = TransformerModel.build_model(args, task)
    V = len(d)
    g = torch.Generator().manual_seed(seed + 1)
    src = torch.randint(d.nspecial, V, (B, S), generator=g)
    src[0, :2] = d.pad()  # left-padded source
    tgt = torch.randint(d.nspecial, V, (B, T), generator=g)
    tgt[1, -2:] = d.pad()
    tgt[2, -4:] = d.pad()
    prev = torch.cat([torch.full((B, 1), d.eos()), tgt[:, :-1]], 1)
    prev[1, -1:] = d.pad()
    sample = {
        "net_input": {"src_tokens": src, "src_lengths": src.ne(d.pad()).sum(1), "prev_output_tokens": prev},
        "target": tgt,
        "ntokens": int(tgt.ne(d.pad()).sum()),
    }
    return model, task, sample


def _loss_and_grads(criterion_cls, model, task, sample, **kw):
    model = copy.deepcopy(model)
    model.train()
    crit = criterion_cls(task, sentence_avg=kw.pop("sentence_avg", False), label_smoothing=kw.pop("eps", 0.1), **kw)
    loss, sample_size, log = crit(model, sample)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), sample_size, log, grads


def test_registered_with_fairseq_options():
    assert CRITERION_REGISTRY["ls_label_smoothed_cross_entropy"] is LsLabelSmoothedCrossEntropyCriterion
    fields = set(LsLabelSmoothedCrossEntropyCriterion.__dataclass.__dataclass_fields__)
    assert {"label_smoothing", "report_accuracy", "ignore_prefix_size", "sentence_avg"} <= fields


@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("ignore_prefix_size", [0, 1])
@pytest.mark.parametrize("sentence_avg", [False, True])
def test_matches_fairseq_criterion(eps, ignore_prefix_size, sentence_avg):
    model, task, sample = _model_and_sample()
    kw = dict(eps=eps, ignore_prefix_size=ignore_prefix_size, report_accuracy=True, sentence_avg=sentence_avg)
    ours = _loss_and_grads(LsLabelSmoothedCrossEntropyCriterion, model, task, sample, **dict(kw))
    ref = _loss_and_grads(LabelSmoothedCrossEntropyCriterion, model, task, sample, **dict(kw))
    torch.testing.assert_close(ours[0], ref[0], rtol=1e-5, atol=1e-5)
    assert ours[1] == ref[1]
    assert set(ours[2]) == set(ref[2])
    for k in ("loss", "nll_loss"):
        torch.testing.assert_close(ours[2][k], ref[2][k], rtol=1e-5, atol=1e-5)
    for k in ("ntokens", "nsentences", "sample_size", "n_correct", "total"):
        assert ours[2][k] == ref[2][k], k
    assert set(ours[3]) == set(ref[3]) and len(ours[3]) > 10
    for name in ref[3]:
        torch.testing.assert_close(ours[3][name], ref[3][name], rtol=1e-4, atol=1e-6, msg=name)


def test_unreduced_loss_matches_fairseq():
    model, task, sample = _model_and_sample(seed=3)
    model.eval()
    net_output = model(**sample["net_input"])
    ours = LsLabelSmoothedCrossEntropyCriterion(task, False, 0.1).compute_loss(model, net_output, sample, reduce=False)
    ref = LabelSmoothedCrossEntropyCriterion(task, False, 0.1).compute_loss(model, net_output, sample, reduce=False)
    for a, b in zip(ours, ref):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_reduce_metrics_logs_the_same_keys():
    model, task, sample = _model_and_sample(seed=1)
    logs = {}
    for cls in (LsLabelSmoothedCrossEntropyCriterion, LabelSmoothedCrossEntropyCriterion):
        _, _, log, _ = _loss_and_grads(cls, model, task, sample, report_accuracy=True)
        with metrics.aggregate(new_root=True) as agg:
            cls.reduce_metrics([log, log])
            logs[cls] = agg.get_smoothed_values()
    ours, ref = logs.values()
    assert set(ours) == set(ref) and {"loss", "nll_loss", "ppl", "accuracy"} <= set(ours)
    for k in ref:
        assert ours[k] == pytest.approx(ref[k], rel=1e-4, abs=1e-3), k
    assert LsLabelSmoothedCrossEntropyCriterion.logging_outputs_can_be_summed()


def test_bad_target_is_a_clear_error():
    model, task, sample = _model_and_sample(seed=2)
    sample["target"][0, 0] = 10_000
    crit = LsLabelSmoothedCrossEntropyCriterion(task, False, 0.1)
    with pytest.raises(RuntimeError, match=r"= 10000 is out of range for V = "):
        crit(model, sample)
