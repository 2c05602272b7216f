"""ls_label_smoothed_cross_entropy's fused output projection + loss on a tiny ls_transformer, through
fairseq's criterion API: the model returns features, ops.linear_label_smoothed_cross_entropy projects
and takes the loss chunk by chunk, and the result (loss, nll_loss, logging outputs, every parameter's
gradient) equals fairseq's own label_smoothed_cross_entropy on the model's logits, while no
[tokens, V] tensor is kept for backward."""

import pytest
import torch
from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion
from fairseq.models.transformer import TransformerModel

from fairseq_lightseq.criterions.ls_label_smoothed_cross_entropy import LsLabelSmoothedCrossEntropyCriterion
from fairseq_lightseq.models.ls_transformer import LSTransformerModel
from support.models import batch, build, make_task, pair, perturb_

from scripts.bench_support.saved_bytes import SavedBytes  # (what scripts/benchmark.py counts)


def _sample(task, seed=1, B=4, S=7, T=9):
    src, src_lengths, tgt = batch(task, B=B, S=S, T=T, seed=seed)
    eos = task.target_dictionary.eos()
    prev = torch.cat([torch.full((B, 1), eos), tgt[:, :-1]], 1)
    prev.masked_fill_(tgt.eq(task.target_dictionary.pad()), task.target_dictionary.pad())
    return {"net_input": {"src_tokens": src, "src_lengths": src_lengths, "prev_output_tokens": prev},
            "target": tgt, "ntokens": int(tgt.ne(task.target_dictionary.pad()).sum())}


def _run(criterion_cls, model, task, sample, grad=True, **kw):
    """(loss, sample_size, logging_output, {name: grad}, saved [(shape, dtype)]) of one criterion call."""
    crit = criterion_cls(task, kw.pop("sentence_avg", False), kw.pop("eps", 0.1), **kw)
    model.zero_grad(set_to_none=True)
    with torch.set_grad_enabled(grad), SavedBytes() as saved:
        loss, sample_size, log = crit(model, sample)
    if grad:
        loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), sample_size, log, grads, saved


def _assert_same(ours, ref):
    torch.testing.assert_close(ours[0], ref[0], rtol=1e-5, atol=1e-5)
    assert ours[1] == ref[1]
    assert set(ours[2]) == set(ref[2])
    for k, v in ref[2].items():
        if isinstance(v, torch.Tensor):
            torch.testing.assert_close(ours[2][k], v, rtol=1e-5, atol=1e-5, msg=k)
        else:
            assert ours[2][k] == v, k
    assert set(ours[3]) == set(ref[3])
    for name in ref[3]:
        torch.testing.assert_close(ours[3][name], ref[3][name], rtol=1e-4, atol=1e-6, msg=name)


def _logits_sized(saved, n_rows, V):
    """The saved storages holding at least n_rows * V elements with V last: logits-sized tensors."""
    return [k for (_, shape, _) in saved._seen.values() for k in [shape]
            if len(shape) >= 2 and shape[-1] == V and torch.Size(shape).numel() >= n_rows * V]


@pytest.mark.parametrize("share", ["none", "decoder", "all"])
@pytest.mark.parametrize("ignore_prefix_size", [0, 1])
@pytest.mark.parametrize("report_accuracy", [False, True])
@pytest.mark.parametrize("sentence_avg", [False, True])
def test_fused_projection_equals_fairseq_criterion(share, ignore_prefix_size, report_accuracy, sentence_avg):
    task = make_task(joined=share == "all", src_size=37, tgt_size=43)
    shares = {"none": {}, "decoder": {"share_decoder_input_output_embed": True},
              "all": {"share_all_embeddings": True}}[share]
    _, model = pair(task, seed=2, **shares)
    if share != "none":
        assert model.decoder.output_projection.weight is model.decoder.embed_tokens.weight
    sample = _sample(task)
    kw = dict(ignore_prefix_size=ignore_prefix_size, report_accuracy=report_accuracy, sentence_avg=sentence_avg)
    ours = _run(LsLabelSmoothedCrossEntropyCriterion, model, task, sample, **kw)
    ref = _run(LabelSmoothedCrossEntropyCriterion, model, task, sample, **kw)
    _assert_same(ours, ref)
    assert ("n_correct" in ours[2]) == report_accuracy
    V, N = len(task.target_dictionary), sample["target"].numel()
    assert _logits_sized(ref[4], N - 4 * ignore_prefix_size, V)  # fairseq keeps the logits (the check can fail)
    assert not _logits_sized(ours[4], 1, V)  # the fused path keeps no [.., V] activation at all


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_fused_projection_without_grad_equals_fairseq(eps):
    """Validation (eval mode, no grad): the loss chunk by chunk, the same logging outputs."""
    task = make_task()
    _, model = pair(task, seed=3)
    model.eval()
    sample = _sample(task, seed=4)
    ours = _run(LsLabelSmoothedCrossEntropyCriterion, model, task, sample, grad=False, eps=eps, report_accuracy=True)
    ref = _run(LabelSmoothedCrossEntropyCriterion, model, task, sample, grad=False, eps=eps, report_accuracy=True)
    _assert_same(ours, ref)
    assert not ours[0].requires_grad


def test_fused_projection_saves_less_than_the_logits_path():
    """The fused path's saved bytes, as the benchmark's SavedBytes counts them (parameters left out):
    the logits path's minus the logits and what only they needed, plus dfeatures [N, E] and dweight
    [V, E] fp32."""
    task = make_task(src_size=300)
    _, model = pair(task, seed=5)
    model.ls_packed = False  # the same padded rows on both paths (packed rows: tests/fairseq/test_packed.py)
    sample = _sample(task, seed=6)
    params = list(model.parameters())
    crit = LsLabelSmoothedCrossEntropyCriterion(task, False, 0.1)
    with SavedBytes(params) as logits_path:  # the same criterion's logits path, as before the fusion
        net_output = model(**sample["net_input"])
        loss, _ = crit.compute_loss(model, net_output, sample)
    logits_path.finish(loss)
    with SavedBytes(params) as fused:
        loss, _, _ = crit(model, sample)
    fused.finish(loss)
    N, V, E = sample["target"].numel(), len(task.target_dictionary), model.decoder.embed_dim
    # gone: the logits [N, V] and, with them, what the loss op saved beside them (target [N] int64, lse
    # [N] fp32) and the features [N, E] the projection saved; added: dfeatures [N, E] and dweight [V, E]
    removed = N * V * 4 + N * 8 + N * 4 + N * E * 4
    assert fused.bytes == logits_path.bytes - removed + (N * E + V * E) * 4


@pytest.mark.parametrize("make_model", ["adaptive_softmax", "projection_bias"])
def test_unusual_decoders_take_the_logits_path(make_model):
    """An adaptive softmax (no logits) or an output projection with a bias: the criterion does what it did
    before (features_only is never asked for), and agrees with fairseq."""
    task = make_task()
    torch.manual_seed(7)
    if make_model == "adaptive_softmax":
        model = perturb_(build(TransformerModel, task, adaptive_softmax_cutoff="10,20"), 7)
    else:
        model = perturb_(build(LSTransformerModel, task), 7)
        proj = model.decoder.output_projection
        model.decoder.output_projection = torch.nn.Linear(proj.in_features, proj.out_features, bias=True)
    assert LsLabelSmoothedCrossEntropyCriterion.projection_weight(model) is None
    sample = _sample(task, seed=8)
    ours = _run(LsLabelSmoothedCrossEntropyCriterion, model, task, sample, report_accuracy=make_model != "adaptive_softmax")
    ref = _run(LabelSmoothedCrossEntropyCriterion, model, task, sample, report_accuracy=make_model != "adaptive_softmax")
    _assert_same(ours, ref)


def test_unreduced_loss_takes_the_logits_path():
    """reduce=False: per-token [N, 1] losses as fairseq's, from the logits."""
    task = make_task()
    _, model = pair(task, seed=9)
    sample = _sample(task, seed=10)
    ours, _, _ = LsLabelSmoothedCrossEntropyCriterion(task, False, 0.1)(model, sample, reduce=False)
    ref, _, _ = LabelSmoothedCrossEntropyCriterion(task, False, 0.1)(model, sample, reduce=False)
    assert ours.shape == ref.shape == (sample["target"].numel(), 1)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("model_cls", ["ls", "fairseq"])
def test_fused_projection_with_decoder_output_dim(model_cls):
    """--decoder-output-dim: the features are the decoder's output after project_out_dim (what the
    projection takes), on ours and on fairseq's own transformer run with our criterion."""
    task = make_task()
    cls = LSTransformerModel if model_cls == "ls" else TransformerModel
    model = perturb_(build(cls, task, decoder_output_dim=12, decoder_ffn_embed_dim=20, decoder_attention_heads=2,
                           ls_packed=False), 5)  # fairseq's criterion runs the padded rows (packed: test_packed.py)
    assert model.decoder.project_out_dim is not None
    sample = _sample(task, seed=6)
    ours = _run(LsLabelSmoothedCrossEntropyCriterion, model, task, sample)
    ref = _run(LabelSmoothedCrossEntropyCriterion, model, task, sample)
    _assert_same(ours, ref)
    assert not _logits_sized(ours[4], 1, len(task.target_dictionary))
