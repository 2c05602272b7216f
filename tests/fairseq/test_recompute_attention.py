"""--ls-recompute-attention: each family's default (translation recomputes q, k, v in backward; the LM
and RoBERTa keep them), the option overriding it at build, fairseq's own parser taking it, and the same
training gradients either way."""
import pytest
import torch

from fairseq import options
from fairseq_lightseq.models.ls_roberta import LSRobertaModel
from fairseq_lightseq.models.ls_transformer import LSTransformerModel
from fairseq_lightseq.models.ls_transformer_lm import LSTransformerLanguageModel
from fairseq_lightseq.modules.transformer_layer import TransformerLayerBase

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
