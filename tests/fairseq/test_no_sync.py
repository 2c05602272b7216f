"""No host-device sync in our part of a training step: model forward/backward, the ls criterion, the
ls_adam update (through fairseq's criterion and optimizer objects; fairseq's own code may sync).

On CPU a sync cannot be observed, so the test catches what would be one on a GPU: a call of
Tensor.item / __bool__ / __float__ / __int__ made from a frame inside fairseq_lightseq. The one
allowed conversion is ops.dropout_stream.next_seed, the dropout seed drawn from torch's CPU generator (a
CPU tensor whatever the model's device: never a device sync; one per encoder/decoder forward).
On CUDA the step runs under torch.cuda.set_sync_debug_mode("error")."""
import argparse
import os
import sys

import pytest
import torch

from support.models import build, make_task
import fairseq_lightseq
from fairseq_lightseq.criterions.ls_label_smoothed_cross_entropy import LsLabelSmoothedCrossEntropyCriterion
from fairseq_lightseq.models.ls_transformer import LSTransformerModel
from fairseq_lightseq.optim import LSAdam

PACKAGE = os.path.dirname(os.path.abspath(fairseq_lightseq.__file__))
# next_seed: the dropout seed; pack: --ls-packed's one read of each padded side's mask per batch, before any
# layer runs (modules/packing.py)
ALLOWED = {("dropout_stream.py", "next_seed"), ("packing.py", "pack")}
CONVERSIONS = ("item", "__bool__", "__float__", "__int__", "__index__")


def _setup(device, **overrides):
    task = make_task()
    torch.manual_seed(0)
    model = build(LSTransformerModel, task, dropout=0.1, attention_dropout=0.1, activation_dropout=0.1,
                  **overrides).to(device).train()
    criterion = LsLabelSmoothedCrossEntropyCriterion(task, False, 0.1, report_accuracy=True)
    cfg = argparse.Namespace(lr=[1e-3], adam_betas="(0.9, 0.98)", adam_eps=1e-8, weight_decay=0.01, amsgrad=False,
                             fp16_adam_stats=False, tpu=False, use_old_adam=False)
    optimizer = LSAdam(cfg, list(model.parameters()))
    d = task.target_dictionary
    g = torch.Generator().manual_seed(1)
    src = torch.randint(d.nspecial, len(d), (3, 7), generator=g)
    src[1, :2] = src[2, :4] = d.pad()  # left-padded sources
    tgt = torch.randint(d.nspecial, len(d), (3, 5), generator=g)
    tgt[1, 4:] = tgt[2, 3:] = d.pad()  # right-padded targets
    prev = torch.cat([torch.full((3, 1), d.eos()), tgt[:, :-1]], dim=1).masked_fill(tgt.eq(d.pad()), d.pad())
    sample = {"net_input": {"src_tokens": src.to(device), "src_lengths": src.ne(d.pad()).sum(1).to(device),
                            "prev_output_tokens": prev.to(device)},
              "target": tgt.to(device), "ntokens": int(tgt.ne(d.pad()).sum()), "nsentences": 3}
    return model, criterion, optimizer, sample


def _train_step(model, criterion, optimizer, sample, scale):
    """Our part of fairseq's train step: the criterion's loss (the fused output projection + loss, as its
    forward runs it, and the accuracy counts; not the forward's logging, which reads values as fairseq's
    does) and the logits path too, backward, the Trainer's multiply_grads and clip_grad_norm, and the
    optimizer's step with a tensor scale (what FP16Optimizer passes after gradient clipping)."""
    weight = criterion.projection_weight(model)
    assert weight is not None
    net_output = model(**sample["net_input"], **criterion.fused_kwargs(model))
    loss, _, argmax, target = criterion.loss_and_nll(model, net_output, sample, True, weight)
    criterion._accuracy(argmax, target)
    net_output = model(**sample["net_input"])
    loss = loss + criterion.compute_loss(model, net_output, sample)[0]
    criterion.compute_accuracy(model, net_output, sample)
    optimizer.backward(loss)
    optimizer.multiply_grads(0.5)
    optimizer.clip_grad_norm(1.0)
    optimizer.step(scale=scale)
    optimizer.zero_grad()


def _caller_inside_package():
    """The innermost fairseq_lightseq frame calling the conversion, or None."""
    f = sys._getframe(2)
    while f is not None:
        path = os.path.abspath(f.f_code.co_filename)
        if path.startswith(PACKAGE + os.sep):
            return os.path.basename(path), f.f_code.co_name, f.f_lineno
        f = f.f_back
    return None


@pytest.mark.parametrize("normalize_before, packed", [(False, False), (True, False), (False, True)],
                         ids=["post_ln", "pre_ln", "packed"])
def test_train_step_converts_no_tensor_to_a_python_value(monkeypatch, normalize_before, packed):
    model, criterion, optimizer, sample = _setup("cpu", encoder_normalize_before=normalize_before,
                                                 decoder_normalize_before=normalize_before, ls_packed=packed)
    _train_step(model, criterion, optimizer, sample, torch.tensor(2.0))  # first step: state created
    calls = []
    for name in CONVERSIONS:
        original = getattr(torch.Tensor, name)

        def spy(self, *args, _original=original, _name=name):
            where = _caller_inside_package()
            if where is not None and where[:2] not in ALLOWED:
                calls.append((_name,) + where)
            return _original(self, *args)

        monkeypatch.setattr(torch.Tensor, name, spy)
    _train_step(model, criterion, optimizer, sample, torch.tensor(2.0))
    _train_step(model, criterion, optimizer, sample, 0.5)
    monkeypatch.undo()
    assert calls == []


def test_the_spy_sees_a_conversion_inside_the_package(monkeypatch):
    """The check above can fail: a conversion made by our code is recorded."""
    from fairseq_lightseq.ops import dropout_stream

    seen = []
    original = torch.Tensor.__int__

    def spy(self):
        seen.append(_caller_inside_package())
        return original(self)

    monkeypatch.setattr(torch.Tensor, "__int__", spy)
    dropout_stream.next_seed()
    monkeypatch.undo()
    assert seen and seen[0][:2] == ("dropout_stream.py", "next_seed")


def test_tensor_scale_divides_the_grads_as_a_float_scale():
    a = _setup("cpu")
    b = _setup("cpu")
    for (model, criterion, optimizer, sample), scale in ((a, torch.tensor(4.0)), (b, 4.0)):
        torch.manual_seed(3)
        _train_step(model, criterion, optimizer, sample, scale)
    for p, q in zip(a[0].parameters(), b[0].parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)


@pytest.mark.cuda
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_train_step_on_cuda_does_not_sync(monkeypatch, packed):
    """Packed: no sync but packing's one read of each side's padding mask (made with sync checks off)."""
    from fairseq_lightseq.modules import packing

    model, criterion, optimizer, sample = _setup("cuda", ls_packed=packed)
    scale = torch.tensor(2.0, device="cuda")
    _train_step(model, criterion, optimizer, sample, scale)  # first step: state created
    torch.cuda.synchronize()
    original = packing.pack

    def pack_allowed(mask):
        torch.cuda.set_sync_debug_mode("default")
        try:
            return original(mask)
        finally:
            torch.cuda.set_sync_debug_mode("error")

    monkeypatch.setattr(packing, "pack", pack_allowed)
    torch.cuda.set_sync_debug_mode("error")
    try:
        _train_step(model, criterion, optimizer, sample, scale)
    finally:
        torch.cuda.set_sync_debug_mode("default")
