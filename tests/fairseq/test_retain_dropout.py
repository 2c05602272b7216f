"""fairseq's inference-dropout switch (`make_generation_fast_(retain_dropout=..., retain_dropout_modules=...)`,
what fairseq-generate --retain-dropout[-modules] calls) acts on ls_transformer as on fairseq's transformer:
the same dropout modules, under the same names and module names, get switched on, and a switched-on
dropout behaves as in training."""
import pytest
import torch
from fairseq.modules import FairseqDropout

from support.models import batch, make_task, pair

DROPOUTS = dict(dropout=0.3, attention_dropout=0.2, activation_dropout=0.25)


def _switches(model):
    """{path: (module_name, p, apply_during_inference)} of every FairseqDropout in the model."""
    return {n: (m.module_name, m.p, m.apply_during_inference) for n, m in model.named_modules()
            if isinstance(m, FairseqDropout)}


@pytest.mark.parametrize("modules", [None, ["TransformerEncoderLayerBase"], ["MultiheadAttention", "TransformerDecoder"],
                                     ["NoSuchModule"]])
def test_same_switches_as_fairseq(modules):
    ref, ours = pair(**DROPOUTS)
    for m in (ref, ours):
        m.eval()
        m.make_generation_fast_(retain_dropout=True, retain_dropout_modules=modules)
    expected = _switches(ref)
    assert expected and any(on for *_, on in expected.values()) == (modules != ["NoSuchModule"])
    assert _switches(ours) == expected


def _logits(model, task, seed):
    src, lengths, prev = batch(task, B=4, S=9, T=7)
    torch.manual_seed(seed)
    with torch.no_grad():
        return model(src, lengths, prev)[0]


def test_retained_dropout_is_training_dropout():
    """eval + retain_dropout draws exactly the masks of train mode (same seed): same logits; without
    the switch, eval mode is deterministic."""
    task = make_task()
    _, ours = pair(task, **DROPOUTS)
    trained = _logits(ours.train(), task, seed=5)
    ours.eval()
    plain = _logits(ours, task, seed=5)
    assert torch.equal(plain, _logits(ours, task, seed=6))
    ours.make_generation_fast_(retain_dropout=True)
    retained = _logits(ours, task, seed=5)
    assert not torch.allclose(retained, plain)
    torch.testing.assert_close(retained, trained, rtol=0, atol=0)
    assert not torch.allclose(retained, _logits(ours, task, seed=6))


def test_retain_dropout_modules_selects_layers():
    """Only the named modules drop: retaining TransformerEncoderLayerBase leaves the decoder (and the
    embeddings) deterministic, so the decoder-only selection differs from it and from eval mode."""
    task = make_task()
    outs = {}
    for modules in (["TransformerEncoderLayerBase"], ["TransformerDecoderLayerBase"]):
        _, ours = pair(task, **DROPOUTS)
        ours.eval()
        ours.make_generation_fast_(retain_dropout=True, retain_dropout_modules=modules)
        enabled = {n for n, (_, _, on) in _switches(ours).items() if on}
        side = "encoder.layers." if modules[0].startswith("TransformerEncoder") else "decoder.layers."
        assert enabled == {f"{side}{i}.{d}" for i in range(2) for d in ("dropout_module", "activation_dropout_module")}
        outs[modules[0]] = _logits(ours, task, seed=5)
    _, plain = pair(task, **DROPOUTS)
    base = _logits(plain.eval(), task, seed=5)
    enc, dec = outs.values()
    assert not torch.allclose(enc, base) and not torch.allclose(dec, base) and not torch.allclose(enc, dec)
