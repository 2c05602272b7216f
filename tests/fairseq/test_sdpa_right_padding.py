"""Causal self-attention over right-padded rows under torch SDPA runs without the key padding mask
(ops.blocks.attention.sdpa_key_padding_mask): SDPA's causal flag (or, for an allgather rank's queries, the
lower-right band) instead of a [B, 1, Tq, Tk] band minus the pad keys. Checked here, float64, SDPA on the
CPU (--ls-attention sdpa, dropouts 0):

- the padding side comes from the task at build (language_modeling: right; translation: right unless
  --left-pad-target; anything else: unknown, mask kept);
- one process, both the compiled block and the per-op chain, both families: every real row, the loss and
  every gradient equal the masked run's; the pad rows differ (the mask really went, in the compiled block
  too), and the compiled block's pad rows are the chain's (its C++ sdpa_mask took SDPA's causal flag);
- left-padded targets keep the mask and match the explicit attention (and would not without the mask);
- sequence parallelism (ulysses and allgather, P = 2 over gloo): the sharded run without the mask equals
  the one-process masked run (support.sp), and what autograd saves holds no [Tq, Tk] mask under ulysses
  and no batch-sized one under allgather.
"""
import argparse

import pytest
import torch
import torch.nn.functional as F

from fairseq.tasks.language_modeling import LanguageModelingConfig, LanguageModelingTask
from fairseq.tasks.translation import TranslationConfig, TranslationTask

from fairseq_lightseq.models.common import right_padded_targets
from fairseq_lightseq.modules import multihead_attention, transformer_layer
from fairseq_lightseq.ops.blocks.attention import sdpa_mask, sdpa_key_padding_mask

from support.dist import run
from support.models import TINY, batch, make_dict, make_task, perturb_
from support.sp import assert_sharded_equals_one_process

PAD = 1


def _lm_task():
    return LanguageModelingTask(LanguageModelingConfig(), make_dict(37))


def _translation_task(left_pad_target=False):
    d = make_dict(37)
    return TranslationTask(TranslationConfig(left_pad_target=left_pad_target), d, d)


def _model(family, task):
    """The family's tiny model built with `task` (so its decoder's padding side is the task's), random
    weights, float64, padded rows (--ls-packed False: this file checks the padded path's SDPA masks; packed
    rows: tests/fairseq/test_packed.py)."""
    from fairseq_lightseq.models.ls_transformer import LSTransformerModel
    from fairseq_lightseq.models.ls_transformer_lm import LSTransformerLanguageModel
    from support.lm import build_lm, perturb_lm_

    torch.manual_seed(0)
    if family == "lm":
        model = perturb_lm_(build_lm(LSTransformerLanguageModel, task), 0).double()
    else:
        model = perturb_(LSTransformerModel.build_model(argparse.Namespace(**TINY), task), 0).double()
    model.ls_packed = False
    return model


def _left_pad(t):
    """Each row's real tokens moved to the right end (the left padding fairseq's collater gives)."""
    out = torch.full_like(t, PAD)
    for b, row in enumerate(t):
        real = row[row.ne(PAD)]
        out[b, t.size(1) - len(real):] = real
    return out


def _sample(family, task, shape, seed=10, left_pad=False):
    """A fairseq sample: LM B = 3 right-padded blocks of T tokens (support.lm); translation B = 3
    sentences, left-padded source, targets right padded (or left padded), the next token as target."""
    if family == "lm":
        from support.lm import lm_batch

        (T,) = shape
        tokens, target = lm_batch(task, B=3, T=T, seed=seed)
        return {"net_input": {"src_tokens": tokens, "src_lengths": tokens.ne(PAD).sum(1)}, "target": target,
                "ntokens": int(target.ne(PAD).sum())}
    S, T = shape
    src, lengths, prev = batch(task, B=3, S=S, T=T, seed=seed)
    target = torch.cat([prev[:, 1:], torch.full_like(prev[:, :1], PAD)], 1)
    target[:, -1] = torch.where(prev[:, -1].ne(PAD), task.target_dictionary.eos(), target[:, -1])
    target = torch.where(prev.ne(PAD) & target.eq(PAD), task.target_dictionary.eos(), target)
    if left_pad:
        prev, target = _left_pad(prev), _left_pad(target)
    return {"net_input": {"src_tokens": src, "src_lengths": lengths, "prev_output_tokens": prev},
            "target": target, "ntokens": int(target.ne(PAD).sum())}


def _criterion(family, task):
    from fairseq_lightseq.criterions.ls_cross_entropy import LsCrossEntropyCriterion
    from fairseq_lightseq.criterions.ls_label_smoothed_cross_entropy import LsLabelSmoothedCrossEntropyCriterion

    if family == "lm":
        return LsCrossEntropyCriterion(task, False)
    return LsLabelSmoothedCrossEntropyCriterion(task, False, 0.1, report_accuracy=True)


def _decoder_rows(sample):
    """[B, T] bool: the decoder's real rows."""
    net = sample["net_input"]
    return net.get("prev_output_tokens", net["src_tokens"]).ne(PAD)


def _run(model, criterion, sample):
    """(logits [B, T, V], loss, {name: grad}) of one training forward (logits) and one criterion
    forward + backward."""
    model.train()
    model.zero_grad()
    logits = model(**sample["net_input"])[0].detach()
    loss, _, _ = criterion(model, sample)
    loss.backward()
    return logits, loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _assert_same_real_rows(a, b, rows, tol=1e-12):
    (la, lossa, ga), (lb, lossb, gb) = a, b
    torch.testing.assert_close(la[rows], lb[rows], rtol=tol, atol=tol)
    torch.testing.assert_close(lossa, lossb, rtol=tol, atol=0)
    assert ga.keys() == gb.keys()
    for n in ga:
        torch.testing.assert_close(ga[n], gb[n], rtol=1e-10, atol=1e-12, msg=lambda m: f"grad {n}: {m}")


# ---- the decision ------------------------------------------------------------------------------------


def test_only_causal_right_padded_attention_drops_the_mask():
    kpm = torch.zeros(2, 5, dtype=torch.bool)
    assert sdpa_key_padding_mask(kpm, True, True) is None
    assert sdpa_key_padding_mask(kpm, True, False) is kpm
    assert sdpa_key_padding_mask(kpm, False, True) is kpm  # bidirectional: pad keys are reachable
    assert sdpa_key_padding_mask(None, True, False) is None


def test_padding_side_comes_from_the_task():
    assert right_padded_targets(_lm_task())
    assert right_padded_targets(_translation_task())
    assert not right_padded_targets(_translation_task(left_pad_target=True))
    assert not right_padded_targets(make_task())  # unknown: the mask is kept
    assert _model("lm", _lm_task()).decoder.right_padded
    assert _model("translation", _translation_task()).decoder.right_padded
    assert not _model("translation", _translation_task(left_pad_target=True)).decoder.right_padded
    assert not _model("lm", make_task()).decoder.right_padded


@pytest.mark.parametrize("Tq,Tk", [(1, 6), (4, 4), (3, 7)])
def testsdpa_mask_without_padding_is_the_lower_right_band(Tq, Tk):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, n, 8, generator=g, dtype=torch.float64) for n in (Tq, Tk, Tk))
    mask, is_causal = sdpa_mask(None, True, Tq, Tk, q.device)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal)
    band = torch.ones(Tq, Tk, dtype=torch.bool).tril(Tk - Tq)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=band), rtol=1e-12, atol=1e-12)
    if Tq == Tk:
        assert mask is None and is_causal


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lower_right_band_on_cuda_keeps_no_mask(dtype):
    """CUDA: SDPA's flash/efficient kernels take causal_lower_right without a mask tensor (nothing [Tq, Tk]
    saved for backward), and give the explicit band's output and gradients."""
    B, H, Tq, Tk, hd = 2, 4, 64, 192, 64
    g = torch.Generator(device="cuda").manual_seed(0)
    inputs = [torch.randn(B, H, n, hd, generator=g, device="cuda", dtype=dtype) for n in (Tq, Tk, Tk)]
    dout = torch.randn(B, H, Tq, hd, generator=g, device="cuda", dtype=dtype)
    band = torch.ones(Tq, Tk, dtype=torch.bool, device="cuda").tril(Tk - Tq)
    results, saved = [], []
    for lower_right in (True, False):
        q, k, v = (t.clone().requires_grad_() for t in inputs)
        mask, is_causal = sdpa_mask(None, True, Tq, Tk, q.device) if lower_right else (band, False)
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(tuple(t.shape)) or t, lambda t: t):
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal)
        if lower_right:
            assert not [s for s in saved if s[-2:] == (Tq, Tk)], saved
        out.backward(dout)
        results.append([out.detach().float(), q.grad.float(), k.grad.float(), v.grad.float()])
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)


# ---- one process --------------------------------------------------------------------------------------


@pytest.mark.parametrize("family,shape", [("lm", (9,)), ("translation", (7, 6))])
def test_real_rows_and_gradients_equal_the_masked_run(family, shape, monkeypatch):
    monkeypatch.setattr(multihead_attention.LSMultiheadAttention, "attention_mode", "sdpa")
    assert transformer_layer._blocks_have_kernels("cpu"), "needs the compiled CPU kernels"
    task = _translation_task() if family == "translation" else _lm_task()
    model, criterion = _model(family, task), _criterion(family, task)
    sample = _sample(family, task, shape)
    rows = _decoder_rows(sample)
    assert (~rows).any(), "the batch must have padding"
    runs = {}
    for path in ("blocks", "chain"):
        if path == "chain":
            monkeypatch.setattr(transformer_layer, "_blocks_have_kernels", lambda device_type, packed=False: False)
        for right_padded in (False, True):
            model.decoder.right_padded = right_padded
            runs[path, right_padded] = _run(model, criterion, sample)
    for path in ("blocks", "chain"):
        masked, unmasked = runs[path, False], runs[path, True]
        _assert_same_real_rows(masked, unmasked, rows)
        # pad queries now attend to pad keys: the mask really went
        assert (masked[0][~rows] - unmasked[0][~rows]).abs().max() > 1e-3, path
    # the compiled block's pad rows are the Python path's (SDPA's causal flag, no mask): its C++ sdpa_mask
    # got no padding mask
    torch.testing.assert_close(runs["blocks", True][0], runs["chain", True][0], rtol=1e-10, atol=1e-10)


def test_the_python_path_calls_sdpa_with_its_causal_flag_and_no_mask(monkeypatch):
    monkeypatch.setattr(multihead_attention.LSMultiheadAttention, "attention_mode", "sdpa")
    monkeypatch.setattr(transformer_layer, "_blocks_have_kernels", lambda device_type, packed=False: False)
    calls, sdpa = [], F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
        calls.append((attn_mask is None, is_causal))
        return sdpa(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale)

    monkeypatch.setattr(multihead_attention.F, "scaled_dot_product_attention", spy)
    task = _lm_task()
    model = _model("lm", task)
    sample = _sample("lm", task, (9,))
    for right_padded, expected in ((True, (True, True)), (False, (False, False))):
        calls.clear()
        model.decoder.right_padded = right_padded
        model(**sample["net_input"])
        assert calls == [expected] * len(model.decoder.layers)


def test_left_padded_targets_keep_the_mask(monkeypatch):
    task = _translation_task(left_pad_target=True)
    model, criterion = _model("translation", task), _criterion("translation", task)
    assert not model.decoder.right_padded
    sample = _sample("translation", task, (7, 6), left_pad=True)
    rows = _decoder_rows(sample)
    assert not rows[:, 0].all(), "the batch must have left padding"
    runs = {}
    for mode in ("explicit", "sdpa"):
        monkeypatch.setattr(multihead_attention.LSMultiheadAttention, "attention_mode", mode)
        runs[mode] = _run(model, criterion, sample)
    _assert_same_real_rows(runs["explicit"], runs["sdpa"], rows, tol=1e-10)
    # without the mask real queries would reach the pad keys before them
    model.decoder.right_padded = True
    wrong = _run(model, criterion, sample)
    assert (wrong[0][rows] - runs["sdpa"][0][rows]).abs().max() > 1e-3


# ---- sequence parallelism -----------------------------------------------------------------------------


def _sharded(family, shape, P, mode):
    """support.sp's check: the one-process reference keeps the mask (right_padded False), the sharded run
    leaves it out."""
    task = _translation_task() if family == "translation" else _lm_task()
    model = _model(family, task)
    stacks = [m for m in (getattr(model, "encoder", None), model.decoder) if m is not None]

    def attach(m, sp):
        for stack in stacks:
            stack.sequence_parallel = sp
        m.decoder.right_padded = sp is not None

    log_keys = ("loss", "nll_loss", "ntokens", "nsentences") if family == "translation" else ("loss", "ntokens",
                                                                                              "nsentences")
    return assert_sharded_equals_one_process(model, attach, _criterion(family, task),
                                             lambda d: _sample(family, task, shape, seed=10 + d), P, mode,
                                             f"{family} P={P} {mode} shape={shape}", log_keys)


def _saved_masks(P, mode, right_padded):
    """Shapes autograd saves in one causal self-attention sublayer on this rank's rows, B = 3 right-padded
    rows of T = 11 (T_pad = 12); returns (saved shapes, Tq, Tk, B)."""
    from fairseq_lightseq.modules import LSTransformerDecoderLayer
    from fairseq_lightseq.sequence_parallel.groups import new_sequence_parallel_group
    from fairseq_lightseq.sequence_parallel.sharding import SequenceParallel

    E, H, B, T = 16, 4, 3, 11
    g = new_sequence_parallel_group(P)
    shard = SequenceParallel(g.group, P, g.rank, mode).shard(T)
    torch.manual_seed(0)
    layer = LSTransformerDecoderLayer(E, H, 24, dropout=0.0, attention_dropout=0.0, no_encoder_attn=True).double()
    x = torch.randn(shard.rows, B, E, dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor([T, T - 3, T - 6])
    mask = torch.arange(shard.padded)[None, :] >= lengths[:, None]  # right padded, the shard's rows too
    saved = []

    def pack(t):
        saved.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = layer(x, None, None, None, self_attn_padding_mask=mask, causal=True, shard=shard,
                  right_padded=right_padded)[0]
    y.sum().backward()
    Tq, Tk = (shard.padded, shard.padded) if mode == "ulysses" else (shard.rows, shard.stop)
    return saved, Tq, Tk, B


def _sp_checks(P):
    multihead_attention.LSMultiheadAttention.attention_mode = "sdpa"
    worst = 0.0
    for mode in ("ulysses", "allgather"):
        for family, shapes in (("lm", ((7,), (3,))), ("translation", ((7, 5), (5, 3)))):
            for shape in shapes:
                worst = max(worst, _sharded(family, shape, P, mode))
        # saved for backward: no [Tq, Tk] mask under ulysses; allgather (Tq < Tk past rank 0) keeps the
        # lower-right band that torch materialises on the CPU, [Tq, Tk] without the batch dim (CUDA's
        # kernels take it without any tensor)
        saved, Tq, Tk, B = _saved_masks(P, mode, right_padded=True)
        masks = [s for s in saved if s[-2:] == (Tq, Tk)]
        if mode == "ulysses" or Tq == Tk:
            assert not masks, (mode, masks)
        else:
            assert masks and all(torch.Size(s).numel() == Tq * Tk for s in masks), (mode, masks)
        saved, Tq, Tk, B = _saved_masks(P, mode, right_padded=False)  # the check sees the mask when kept
        assert any(s[-2:] == (Tq, Tk) and torch.Size(s).numel() == B * Tq * Tk for s in saved), (mode, saved)
    return worst


def test_sharded_without_the_mask_equals_one_process_with_it():
    worst = run(_sp_checks, 2, 2, timeout=600)
    print(f"largest relative gradient error {max(worst):.3g}")
