"""The attention options of every ls_* model.

--ls-recompute-attention: each family's default (translation recomputes q, k, v in backward; the LM
and RoBERTa keep them), the option overriding it at build, fairseq's own parser taking it, and the same
training gradients either way.

--ls-attention: which attention runs (auto: the device's choice; sdpa / flash: torch's fused attention;
explicit: our kernels), set at build on every attention module, taken by fairseq's own parser
for every family, a bad value refused naming the option, the two paths giving the same output and
gradients without dropout, and sdpa on the CPU (no torch kernel for packed rows) running padded batches:
--ls-packed's default off, an explicit --ls-packed True refused at build naming both options."""
import pytest
import torch
from torch.nn import functional as F

from fairseq import options
from fairseq_lightseq.models.common import set_attention_mode
from fairseq_lightseq.models.ls_roberta import LSRobertaModel
from fairseq_lightseq.models.ls_transformer import LSTransformerModel
from fairseq_lightseq.models.ls_transformer_lm import LSTransformerLanguageModel
from fairseq_lightseq.modules import transformer_layer
from fairseq_lightseq.modules.multihead_attention import LSMultiheadAttention
from fairseq_lightseq.modules.transformer_layer import TransformerLayerBase

from support.cli import USER_DIR
from support.lm import build_lm, lm_batch
from support.models import build, make_task
from support.roberta import build_roberta, make_mlm_task


def _flags(model):
    flags = {m.recompute_attention for m in model.modules() if isinstance(m, TransformerLayerBase)}
    assert len(flags) == 1
    return flags.pop()


def _build(family, **kw):
    if family == "translation":
        return build(LSTransformerModel, make_task(), **kw)
    if family == "lm":
        return build_lm(LSTransformerLanguageModel, make_task(), **kw)
    return build_roberta(LSRobertaModel, make_mlm_task(), **kw)


@pytest.mark.parametrize("family,default", [("translation", True), ("lm", False), ("roberta", False)])
def test_family_default_and_override(family, default):
    assert _flags(_build(family)) is default
    assert _flags(_build(family, ls_recompute_attention=not default)) is (not default)
    assert _flags(_build(family, ls_recompute_attention=None)) is default  # an older checkpoint's config


@pytest.mark.parametrize("arch", ["ls_transformer", "ls_transformer_lm", "ls_roberta"])
@pytest.mark.parametrize("value", ["True", "False"])
def test_fairseq_parser_takes_the_option(arch, value, tmp_path):
    task = {"ls_transformer": "translation", "ls_transformer_lm": "language_modeling", "ls_roberta": "masked_lm"}
    args = options.parse_args_and_arch(options.get_training_parser(), input_args=[
        str(tmp_path), "--task", task[arch], "--arch", arch, "--ls-recompute-attention", value,
        "--user-dir", "fairseq_lightseq"])
    assert args.ls_recompute_attention is (value == "True")


def test_lm_gradients_do_not_depend_on_the_option():
    task = make_task()
    grads = []
    for recompute in (False, True):
        torch.manual_seed(0)
        model = build_lm(LSTransformerLanguageModel, task, dropout=0.1, attention_dropout=0.1,
                         ls_recompute_attention=recompute).double().train()
        tokens, _ = lm_batch(task)
        model.zero_grad()
        out, _ = model(tokens)
        out.float().sum().backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


# ---- --ls-attention ---------------------------------------------------------------------------------
def _modes(model):
    return {m.attention_mode for m in model.modules() if isinstance(m, LSMultiheadAttention)}


@pytest.mark.parametrize("family", ["translation", "lm", "roberta"])
def test_build_sets_every_attention_module(family):
    assert _modes(_build(family)) == {"auto"}
    assert _modes(_build(family, ls_attention="explicit")) == {"explicit"}
    assert _modes(_build(family, ls_attention="sdpa")) == {"sdpa"}


def test_a_bad_mode_names_the_option():
    with pytest.raises(ValueError, match=r"--ls-attention must be one of auto, sdpa, flash, explicit, got 'fast'"):
        set_attention_mode(_build("lm"), "fast")


@pytest.mark.parametrize("arch,task", [("ls_transformer", "translation"), ("ls_transformer_lm", "language_modeling"),
                                       ("ls_roberta", "masked_lm")])
def test_fairseq_parser_takes_the_attention_mode(arch, task, tmp_path, capsys):
    parse = lambda *extra: options.parse_args_and_arch(options.get_training_parser(), input_args=[  # noqa: E731
        str(tmp_path), "--task", task, "--arch", arch, "--user-dir", "fairseq_lightseq", *extra])
    assert parse("--ls-attention", "sdpa").ls_attention == "sdpa"
    assert getattr(parse(), "ls_attention", None) is None  # fairseq leaves an unset model option out
    with pytest.raises(SystemExit):
        parse("--ls-attention", "fast")
    assert "--ls-attention: invalid choice: 'fast'" in capsys.readouterr().err


def test_the_modes_run_the_path_they_name(monkeypatch):
    """sdpa calls torch's SDPA and explicit never does; the loss and gradients agree (no dropout). The
    per-op chain (the compiled blocks call SDPA from C++, which a Python spy does not see)."""
    monkeypatch.setattr(transformer_layer, "_blocks_have_kernels", lambda device_type, packed=False: False)
    task = make_task()
    model = build_lm(LSTransformerLanguageModel, task).double()
    tokens, _ = lm_batch(task)
    calls, sdpa = [], F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or sdpa(*a, **k))
    results = {}
    for mode in ("explicit", "sdpa"):
        set_attention_mode(model, mode)
        calls.clear()
        model.zero_grad()
        out = model(tokens)[0]
        out.float().logsumexp(-1).sum().backward()
        results[mode] = (out.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None])
        assert bool(calls) is (mode == "sdpa")
    torch.testing.assert_close(results["explicit"][0], results["sdpa"][0])
    for a, b in zip(results["explicit"][1], results["sdpa"][1]):
        torch.testing.assert_close(a, b)


def _parse_and_build(tmp_path, *extra):
    """ls_transformer as fairseq-train builds it on the CPU: fairseq's parser, then the model's build_model."""
    args = options.parse_args_and_arch(options.get_training_parser(), input_args=[
        str(tmp_path), "--task", "translation", "--arch", "ls_transformer", "--user-dir", USER_DIR, "--cpu", *extra])
    return LSTransformerModel.build_model(args, make_task())


@pytest.mark.parametrize("extra,packed", [
    ((), True),
    (("--ls-attention", "sdpa"), False),
    (("--ls-attention", "sdpa", "--ls-packed", "False"), False),
    (("--ls-attention", "flash"), True),
    (("--ls-attention", "explicit"), True),
    (("--ls-attention", "auto", "--ls-packed", "True"), True),
])
def test_sdpa_on_the_cpu_turns_packing_off(tmp_path, extra, packed):
    model = _parse_and_build(tmp_path, *extra)
    assert model.ls_packed is packed
    assert _modes(model) == {extra[1] if extra else "auto"}


def test_sdpa_with_an_explicit_packing_on_the_cpu_is_refused_naming_both(tmp_path):
    with pytest.raises(ValueError, match=r"--ls-packed True does not combine with --ls-attention sdpa on the CPU"):
        _parse_and_build(tmp_path, "--ls-attention", "sdpa", "--ls-packed", "True")
