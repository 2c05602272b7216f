"""ls_roberta against fairseq's roberta: same state_dict (and fairseq's key upgrades), same LM logits,
features, inner states, classification-head outputs and gradients (fp32, dropout 0) at every real
position for post-LN, pre-LN, untied, odd sizes and the other options; registration with fairseq's arch
defaults; options refused at build."""
import pytest
import torch

from fairseq.models import ARCH_MODEL_REGISTRY
from fairseq.models.roberta import RobertaModel
from fairseq_lightseq.models.ls_roberta import ARCHITECTURES, LSRobertaModel
from fairseq_lightseq.modules.lm_head import LSRobertaLMHead
from fairseq_lightseq.modules.transformer import LSTransformerEncoder

from support.parity import assert_grads_match, rel_err
from support.roberta import build_roberta, make_mlm_task, mlm_batch, roberta_pair

CONFIGS = {
    "roberta_post_ln": {},
    "prenorm": dict(arch="roberta_prenorm"),
    "prenorm_ln_embedding_untied": dict(arch="roberta_prenorm", layernorm_embedding=True, untie_weights_roberta=True),
    "untied_relu": dict(untie_weights_roberta=True, activation_fn="relu"),
    "odd_dims_gelu_accurate": dict(encoder_embed_dim=15, encoder_ffn_embed_dim=7, encoder_attention_heads=5,
                                   encoder_layers=3, activation_fn="gelu_accurate"),
    "layers_to_keep": dict(encoder_layers=3, encoder_layers_to_keep="0,2"),
    "checkpoint_activations_scaled_embedding": dict(checkpoint_activations=True, no_scale_embedding=False),
}
HEADS = (("cls", 3),)


def forward_backward(model, tokens, seed=3):
    """LM logits [B, T, V], features and inner states, the classification head's [B, 3] (real positions
    only: fairseq's outputs at pads are never used), and the gradients of a random projection of them."""
    real = tokens.ne(1)
    logits, extra = model(tokens, return_all_hiddens=True)
    features, _ = model(tokens, features_only=True)
    cls, _ = model(tokens, classification_head_name="cls")
    g = torch.Generator().manual_seed(seed)
    m = real.unsqueeze(-1)
    loss = (logits * torch.randn(logits.shape, generator=g) * m).sum() + (cls * torch.randn(cls.shape, generator=g)).sum()
    loss.backward()
    states = [(s.transpose(0, 1) * m).detach() for s in extra["inner_states"]]
    outs = [(logits * m).detach(), (features * m).detach(), cls.detach(), *states]
    return outs, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_parity(ref, ours, tokens, tol=1e-5):
    outs_ref, g_ref = forward_backward(ref, tokens)
    outs, g = forward_backward(ours, tokens)
    assert len(outs) == len(outs_ref)
    for i, (a, b) in enumerate(zip(outs, outs_ref)):
        assert rel_err(a, b) < tol, i
    assert_grads_match(g, g_ref, 10 * tol)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_outputs_and_grads_match_fairseq(name):
    task = make_mlm_task()
    ref, ours = roberta_pair(task, heads=HEADS, **CONFIGS[name])
    assert type(ours.encoder.sentence_encoder) is LSTransformerEncoder
    assert type(ours.encoder.lm_head) is LSRobertaLMHead
    assert ours.state_dict().keys() == ref.state_dict().keys()
    assert_parity(ref, ours, mlm_batch(task, B=4, T=9)[0])


def test_unpadded_batch_and_length_one():
    task = make_mlm_task()
    ref, ours = roberta_pair(task, heads=HEADS)
    assert_parity(ref, ours, mlm_batch(task, B=2, T=7, pad=False)[0])
    assert_parity(ref, ours, torch.tensor([[task.source_dictionary.bos()]]))


def test_tied_head_shares_the_embedding_and_learned_positions_have_fairseq_rows():
    task = make_mlm_task()
    ours = build_roberta(LSRobertaModel, task)
    enc = ours.encoder.sentence_encoder
    assert ours.encoder.lm_head.weight is enc.embed_tokens.weight
    assert enc.embed_positions.weight.shape[0] == 32 + enc.padding_idx + 1  # max_positions + pad + 1
    assert enc.layernorm_embedding is not None and enc.embed_scale == 1.0  # --no-scale-embedding
    assert build_roberta(LSRobertaModel, task, untie_weights_roberta=True).encoder.lm_head.weight is not \
        build_roberta(LSRobertaModel, task).encoder.sentence_encoder.embed_tokens.weight


def test_fairseq_key_upgrades_and_checkpoint_heads():
    """An old checkpoint's names (decoder.*, emb_layer_norm) are upgraded by fairseq's own code, and
    --load-checkpoint-heads registers the heads the checkpoint brings (what from_pretrained does)."""
    task = make_mlm_task()
    ref, _ = roberta_pair(task, heads=HEADS)
    old = {k.replace("encoder.", "decoder.", 1).replace(".layernorm_embedding.", ".emb_layer_norm."): v
           for k, v in ref.state_dict().items()}
    ours = build_roberta(LSRobertaModel, task, load_checkpoint_heads=True)
    ours.upgrade_state_dict(old)
    ours.load_state_dict(old, strict=True)
    assert ours.classification_heads["cls"].out_proj.out_features == 3
    ours.eval(), ref.eval()
    tokens = mlm_batch(task)[0]
    with torch.no_grad():
        assert rel_err(ours(tokens, classification_head_name="cls")[0], ref(tokens, classification_head_name="cls")[0]) < 1e-5


# registration with fairseq's defaults: tests/fairseq/test_model_families.py (every family)


def test_every_fairseq_roberta_arch_is_ours():
    native = {a for a, m in ARCH_MODEL_REGISTRY.items() if m is RobertaModel}
    assert {"ls_" + a for a in native} == set(ARCHITECTURES)


@pytest.mark.parametrize("option,value,message", [
    ("encoder_layerdrop", 0.1, "--encoder-layerdrop"),
    ("quant_noise_pq", 0.1, "--quant-noise-pq"),
    ("activation_fn", "tanh", "--activation-fn tanh"),
    ("mha_heads_to_keep", 2, "--mha-heads-to-keep 2"),
    ("ffn_blocks_to_remove", 1, "--ffn-blocks-to-remove 1"),
    ("dropout", 1.5, "--dropout must be in"),
])
def test_unsupported_options_fail_at_build_naming_the_option(option, value, message):
    with pytest.raises(ValueError, match=message) as e:
        build_roberta(LSRobertaModel, make_mlm_task(), **{option: value})
    assert "ls_roberta" in str(e.value)


@pytest.mark.parametrize("extra,message", [
    (dict(criterion="sentence_prediction"), "does not support --criterion sentence_prediction (it needs --criterion ls_masked_lm)"),
    (dict(criterion="masked_lm"), "does not support --criterion masked_lm"),
    (dict(criterion="ls_masked_lm", encoder_attention_heads=3, encoder_embed_dim=15),
     "needs --encoder-attention-heads (3) divisible"),
    (dict(criterion="ls_masked_lm", distributed_world_size=3), "must divide the number of processes"),
], ids=["sentence_prediction", "masked_lm", "heads", "world"])
def test_sequence_parallel_refusals(extra, message):
    args = {"sequence_parallel_size": 2, "distributed_world_size": 2, **extra}
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build_roberta(LSRobertaModel, make_mlm_task(), **args)


def test_encoder_layers_to_keep_prunes_a_full_checkpoint_as_fairseq_does():
    """fairseq's prune_state_dict (what loading with --encoder-layers-to-keep runs) maps layers 0 and 2
    of a 3-layer checkpoint onto our 2-layer model, which then equals fairseq's pruned model."""
    from fairseq.checkpoint_utils import prune_state_dict

    from support.models import arch_args
    from support.roberta import TINY_ROBERTA, perturb_roberta_

    task = make_mlm_task()
    full = perturb_roberta_(build_roberta(RobertaModel, task, encoder_layers=3))
    models = []
    for cls, arch in ((RobertaModel, "roberta"), (LSRobertaModel, "ls_roberta")):
        args = arch_args({**TINY_ROBERTA, "arch": arch}, arch, encoder_layers=3, encoder_layers_to_keep="0,2")
        model = cls.build_model(args, task)
        model.load_state_dict(prune_state_dict(full.state_dict(), args), strict=True)
        models.append(model.eval())
    tokens = mlm_batch(task)[0]
    real = tokens.ne(1).unsqueeze(-1)
    with torch.no_grad():
        assert len(models[1].encoder.sentence_encoder.layers) == 2
        assert rel_err(models[1](tokens)[0] * real, models[0](tokens)[0] * real) < 1e-5
