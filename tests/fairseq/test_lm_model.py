"""ls_transformer_lm against fairseq's transformer_lm: same state_dict, same logits and gradients (fp32,
dropout 0) at every real position, incremental decoding, registration with fairseq's defaults, options
refused at build, and the fused criterion against fairseq's cross_entropy."""
import argparse

import pytest
import torch

from fairseq.criterions.cross_entropy import CrossEntropyCriterion
from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY
from fairseq.models.transformer_lm import TransformerLanguageModel, TransformerLanguageModelConfig
from fairseq_lightseq.criterions.ls_cross_entropy import LsCrossEntropyCriterion
from fairseq_lightseq.criterions.ls_label_smoothed_cross_entropy import LsLabelSmoothedCrossEntropyCriterion
from fairseq_lightseq.models.ls_transformer_lm import ARCHITECTURES, LSTransformerLanguageModel

from support.lm import build_lm, lm_batch, lm_pair
from support.models import make_task
from support.parity import assert_grads_match, rel_err

CONFIGS = {
    "base_relu_sinusoidal": {},
    "gpt_gelu_learned_shared": dict(arch="transformer_lm_gpt"),
    "share_io_no_scale": dict(share_decoder_input_output_embed=True, no_scale_embedding=True),
    "ln_embed_no_final_norm": dict(layernorm_embedding=True, no_decoder_final_norm=True),
    "learned_pos_gelu_accurate": dict(decoder_learned_pos=True, activation_fn="gelu_accurate"),
    "output_dim": dict(decoder_output_dim=12, decoder_attention_heads=2),
    "input_dim": dict(decoder_input_dim=12, decoder_learned_pos=True, layernorm_embedding=True),
    "odd_dims": dict(decoder_embed_dim=15, decoder_ffn_embed_dim=7, decoder_attention_heads=5, decoder_layers=3),
    "no_positions": dict(no_token_positional_embeddings=True),
    "checkpoint_activations": dict(arch="transformer_lm_gpt", checkpoint_activations=True),
}


def forward_backward(model, tokens, seed=3):
    """Logits [B, T, V] and the gradients of a random projection of the logits at the real positions
    (fairseq's logits at pad positions are never used, and differ: it masks pad keys only when the
    batch has padding)."""
    out, _ = model(tokens)
    real = tokens.ne(1).unsqueeze(-1)
    g = torch.Generator().manual_seed(seed)
    (out * torch.randn(out.shape, generator=g) * real).sum().backward()
    return (out * real).detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_parity(ref, ours, tokens, tol=1e-5):
    out_ref, g_ref = forward_backward(ref, tokens)
    out, g = forward_backward(ours, tokens)
    assert rel_err(out, out_ref) < tol
    assert_grads_match(g, g_ref, 10 * tol)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_and_grads_match_fairseq(name):
    task = make_task()
    ref, ours = lm_pair(task, **CONFIGS[name])
    assert ours.state_dict().keys() == ref.state_dict().keys()
    assert_parity(ref, ours, lm_batch(task, B=4, T=9)[0])


def test_unpadded_block_and_length_one():
    task = make_task()
    ref, ours = lm_pair(task)
    assert_parity(ref, ours, lm_batch(task, B=2, T=7, pad=False)[0])  # --sample-break-mode none
    assert_parity(ref, ours, lm_batch(task, B=1, T=1)[0])


def test_incremental_decoding_equals_full_forward():
    task = make_task()
    _, ours = lm_pair(task, arch="transformer_lm_gpt")
    ours.eval()
    tokens = lm_batch(task, B=3, T=6, pad=False)[0]
    with torch.no_grad():
        full, _ = ours(tokens)
        state, steps = {}, []
        for t in range(tokens.size(1)):
            steps.append(ours.decoder(tokens[:, : t + 1], incremental_state=state)[0])
    assert rel_err(torch.cat(steps, 1), full) < 1e-5


def test_plain_arch_has_fairseq_dataclass_defaults():
    """fairseq's --arch transformer_lm takes TransformerLanguageModelConfig's defaults (post-LN, no arch
    function); ls_transformer_lm sets the same ones."""
    ours = argparse.Namespace()
    ARCH_CONFIG_REGISTRY["ls_transformer_lm"](ours)
    theirs = TransformerLanguageModelConfig()
    assert ours.decoder_normalize_before is False
    for name, value in vars(ours).items():
        assert getattr(theirs, name) == value, name


def test_every_fairseq_lm_arch_is_ours_or_refused():
    """Each transformer_lm* arch of fairseq either has an ls_ counterpart or needs adaptive input/softmax."""
    fairseq_archs = [a for a, m in ARCH_MODEL_REGISTRY.items() if m is TransformerLanguageModel]
    for arch in fairseq_archs:
        if "ls_" + arch in ARCHITECTURES:
            continue
        args = argparse.Namespace()
        ARCH_CONFIG_REGISTRY[arch](args)
        assert args.adaptive_input or args.adaptive_softmax_cutoff is not None, arch
        with pytest.raises(ValueError, match="ls_transformer_lm does not support --adaptive"):
            build_lm(LSTransformerLanguageModel, make_task(), **vars(args))


@pytest.mark.parametrize("option,value,message", [
    ("adaptive_softmax_cutoff", "10,20", "--adaptive-softmax-cutoff"),
    ("adaptive_input", True, "--adaptive-input"),
    ("character_embeddings", True, "--character-embeddings"),
    ("decoder_layerdrop", 0.1, "--decoder-layerdrop"),
    ("quant_noise_pq", 0.1, "--quant-noise-pq"),
    ("scale_attn", True, "normformer"),
    ("activation_fn", "tanh", "--activation-fn tanh"),
    ("dropout", 1.5, "--dropout must be in"),
])
def test_unsupported_options_fail_at_build_naming_the_option(option, value, message):
    with pytest.raises(ValueError, match=message) as e:
        build_lm(LSTransformerLanguageModel, make_task(), **{option: value})
    assert "ls_transformer_lm" in str(e.value)


class _Task:
    """What fairseq's criteria read of a task."""

    def __init__(self, task):
        self.target_dictionary = self.source_dictionary = task.source_dictionary


def _sample(task, B=4, T=9):
    tokens, target = lm_batch(task, B=B, T=T)
    return {"net_input": {"src_tokens": tokens, "src_lengths": tokens.ne(1).sum(1)}, "target": target,
            "ntokens": int(target.ne(1).sum())}


def _criterion_step(model, criterion, sample):
    model.zero_grad()
    loss, sample_size, log = criterion(model, sample)
    loss.backward()
    return loss.detach(), sample_size, log, {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("sentence_avg", [False, True])
@pytest.mark.parametrize("share", [False, True])
def test_ls_cross_entropy_matches_fairseq_cross_entropy(sentence_avg, share):
    """Same loss, logging output (keys and values) and gradients as fairseq's cross_entropy, the ls side
    through the fused projection + loss (no logits kept)."""
    task = make_task()
    ref, ours = lm_pair(task, share_decoder_input_output_embed=share)
    sample = _sample(task)
    ref_loss, ref_size, ref_log, ref_g = _criterion_step(ref, CrossEntropyCriterion(_Task(task), sentence_avg), sample)
    crit = LsCrossEntropyCriterion(_Task(task), sentence_avg)
    assert crit.projection_weight(ours) is not None  # the fused path
    loss, size, log, g = _criterion_step(ours, crit, sample)
    assert size == ref_size and log.keys() == ref_log.keys()
    assert rel_err(loss, ref_loss) < 1e-6
    assert rel_err(log["loss"], ref_log["loss"]) < 1e-6
    for n in ref_g:
        if not n.endswith("k_proj.bias"):
            assert rel_err(g[n], ref_g[n]) < 1e-4, n


def test_ls_cross_entropy_unreduced_and_in_eval():
    task = make_task()
    ref, ours = lm_pair(task)
    ref.eval(), ours.eval()
    sample = _sample(task)
    with torch.no_grad():
        net_ref, net = ref(**sample["net_input"]), ours(**sample["net_input"])
        a = CrossEntropyCriterion(_Task(task), False).compute_loss(ref, net_ref, sample, reduce=False)[0]
        b = LsCrossEntropyCriterion(_Task(task), False).compute_loss(ours, net, sample, reduce=False)[0]
        assert b.shape == a.shape and rel_err(b, a) < 1e-6
        full = LsCrossEntropyCriterion(_Task(task), False)(ours, sample)[0]
        assert rel_err(full, a.sum()) < 1e-6


def test_label_smoothed_criterion_on_the_lm():
    task = make_task()
    ref, ours = lm_pair(task, arch="transformer_lm_gpt")
    sample = _sample(task)
    ref_loss, _, ref_log, ref_g = _criterion_step(
        ref, LabelSmoothedCrossEntropyCriterion(_Task(task), False, 0.1, report_accuracy=True), sample)
    loss, _, log, g = _criterion_step(
        ours, LsLabelSmoothedCrossEntropyCriterion(_Task(task), False, 0.1, report_accuracy=True), sample)
    assert rel_err(loss, ref_loss) < 1e-6 and rel_err(log["nll_loss"], ref_log["nll_loss"]) < 1e-6
    assert (log["n_correct"], log["total"]) == (ref_log["n_correct"], ref_log["total"])
    assert rel_err(g["decoder.embed_tokens.weight"], ref_g["decoder.embed_tokens.weight"]) < 1e-4


def test_token_blocks_with_eos_break_mode_build_under_numpy_2():
    """fairseq's TokenBlockDataset (break mode eos: LM training and the hub's sample/score) uses
    np.compat.long, which the plugin restores where numpy 2 removed it."""
    from fairseq.data import TokenBlockDataset

    sizes = [3, 5, 2]
    blocks = TokenBlockDataset([torch.arange(n) for n in sizes], sizes, block_size=None, pad=1, eos=2,
                               break_mode="eos")
    assert len(blocks) == 3 and blocks.sizes.tolist() == sizes
