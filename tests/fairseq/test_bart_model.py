"""ls_bart against fairseq's bart: same state_dict (and fairseq's key upgrades), same decoder logits, encoder
states and classification-head outputs, and the same gradients (fp32, dropout 0) at every real position for
BART and mBART archs; BART's own behaviour (init_bert_params, the heads, the <mask> row dropped for
translation); what ls_bart refuses, each with one error naming the cause."""
import pytest
import torch

from fairseq.models import ARCH_MODEL_REGISTRY
from fairseq.models.bart import BARTModel
from fairseq_lightseq.models.ls_bart import ARCHITECTURES, LSBARTModel
from fairseq_lightseq.modules.transformer import LSTransformerDecoder, LSTransformerEncoder

from support.bart import bart_pair, build_bart, classification_batch, make_bart_task
from support.models import batch, make_task, perturb_
from support.parity import assert_grads_match, rel_err

CONFIGS = {
    "mbart_base": dict(arch="mbart_base"),
    "bart_base": dict(arch="bart_base"),
    "mbart_base_wmt20_prenorm": dict(arch="mbart_base_wmt20", encoder_normalize_before=True,
                                     decoder_normalize_before=True),
    "bart_large_odd_dims_relu": dict(arch="bart_large", encoder_embed_dim=15, encoder_ffn_embed_dim=7,
                                     encoder_attention_heads=5, decoder_attention_heads=5, activation_fn="relu"),
}
HEADS = (("cls", 3),)


def forward_backward(model, task, seed=3):
    """Decoder logits and the encoder's states on a translation batch, the classification head's [B, 3] on
    a sentence-classification batch (real positions only), and the gradients of a random projection of them."""
    src, lens, prev = batch(task, B=3, S=7, T=6)
    logits, extra = model(src, lens, prev)
    enc = model.encoder(src, src_lengths=lens, return_all_hiddens=True)
    csrc, clens, cprev = classification_batch(task)
    cls, _ = model(csrc, clens, cprev, classification_head_name="cls")
    g = torch.Generator().manual_seed(seed)
    m = prev.ne(task.target_dictionary.pad()).unsqueeze(-1)
    loss = (logits * torch.randn(logits.shape, generator=g) * m).sum() + \
        (cls * torch.randn(cls.shape, generator=g)).sum()
    loss.backward()
    real = src.ne(task.source_dictionary.pad()).t().unsqueeze(-1)
    states = [(s * real).detach() for s in enc["encoder_states"]]
    outs = [(logits * m).detach(), cls.detach(), *states]
    return outs, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_outputs_and_grads_match_fairseq(name):
    task = make_bart_task()
    ref, ours = bart_pair(task, heads=HEADS, **CONFIGS[name])
    assert type(ours.encoder) is LSTransformerEncoder and type(ours.decoder) is LSTransformerDecoder
    assert ours.state_dict().keys() == ref.state_dict().keys()
    outs_ref, g_ref = forward_backward(ref, task)
    outs, g = forward_backward(ours, task)
    assert len(outs) == len(outs_ref)
    for i, (a, b) in enumerate(zip(outs, outs_ref)):
        assert rel_err(a, b) < 1e-5, (name, i)
    assert_grads_match(g, g_ref, 1e-4)


def test_registered_archs_have_fairseqs_defaults():
    for name in ARCHITECTURES:
        assert ARCH_MODEL_REGISTRY[name] is LSBARTModel
    task = make_bart_task()
    for arch in ("bart_base", "mbart_base", "mbart_base_wmt20"):
        ref, ours = build_bart(BARTModel, task, arch), build_bart(LSBARTModel, task, arch)
        for side in ("encoder", "decoder"):
            a, b = getattr(ref, side), getattr(ours, side)
            assert a.embed_scale == b.embed_scale and a.max_positions() == b.max_positions()
            assert (a.layernorm_embedding is None) == (b.layernorm_embedding is None)
        assert ours.decoder.output_projection.weight is ours.encoder.embed_tokens.weight  # shared embeddings


def test_initial_weights_are_fairseqs_for_a_seed():
    task = make_bart_task()
    torch.manual_seed(5)
    ref = build_bart(BARTModel, task)
    torch.manual_seed(5)
    ours = build_bart(LSBARTModel, task)
    assert all(torch.equal(v, ref.state_dict()[k]) for k, v in ours.state_dict().items())


def test_unknown_classification_head_is_refused():
    task = make_bart_task()
    _, ours = bart_pair(task, heads=HEADS)
    src, lens, prev = classification_batch(task)
    with pytest.raises(ValueError, match=r"no classification head named 'sentence_classification_head'.*cls"):
        ours(src, lens, prev, classification_head_name="sentence_classification_head")


def test_fairseq_checkpoint_heads_load_and_mask_row_is_dropped_for_translation():
    """A fairseq state with a head the model lacks: registered with load_checkpoint_heads (as
    from_pretrained does), dropped otherwise; a pretrained dictionary's <mask> row is dropped for a
    translation dictionary without <mask> (fairseq's upgrade_state_dict_named)."""
    task = make_bart_task()
    ref, _ = bart_pair(task, heads=HEADS)
    state = ref.state_dict()
    loader = build_bart(LSBARTModel, task, load_checkpoint_heads=True)
    loader.load_state_dict(dict(state))
    assert list(loader.classification_heads) == ["cls"]
    head = loader.classification_heads["cls"].out_proj.weight
    assert torch.equal(head, state["classification_heads.cls.out_proj.weight"])
    plain = build_bart(LSBARTModel, task)
    plain.load_state_dict(dict(state))
    assert list(plain.classification_heads) == []
    translation = build_bart(LSBARTModel, make_task(src_size=37))  # the same words, no <mask>
    translation.load_state_dict(dict(state))
    assert torch.equal(translation.encoder.embed_tokens.weight, state["encoder.embed_tokens.weight"][:-1])


@pytest.mark.parametrize("option,value", [("encoder_layerdrop", 0.1), ("cross_self_attention", True),
                                          ("adaptive_softmax_cutoff", "10,20")])
def test_unsupported_options_are_refused(option, value):
    with pytest.raises(ValueError, match=f"ls_bart does not support --{option.replace('_', '-')}.*--arch bart"):
        build_bart(LSBARTModel, make_bart_task(), **{option: value})


def test_token_embeddings_are_refused():
    task = make_bart_task()
    _, ours = bart_pair(task)
    src, lens, prev = batch(task)
    with pytest.raises(ValueError, match="token_embeddings"):
        ours(src, lens, prev, token_embeddings=torch.zeros(*src.shape, 16))


@pytest.mark.parametrize("family,message", [("roberta", "encoder-only model's"), ("lm", "decoder-only model's")])
def test_another_familys_weights_are_refused(family, message):
    from fairseq.models.roberta import RobertaModel
    from fairseq.models.transformer_lm import TransformerLanguageModel
    from support.lm import build_lm
    from support.roberta import build_roberta

    task = make_bart_task()
    other = build_roberta(RobertaModel, task) if family == "roberta" else build_lm(TransformerLanguageModel, task)
    with pytest.raises(ValueError, match=f"ls_bart: the checkpoint's weights are an? {message}"):
        build_bart(LSBARTModel, task).load_state_dict(other.state_dict())


def test_pad_inside_a_row_runs_padded_as_fairseq():
    """fairseq's denoising noise can replace a source token by <pad>; an ls criterion's forward (packed_rows,
    --ls-packed on) then runs padded and gives fairseq's features."""
    task = make_bart_task()
    ref, ours = bart_pair(task)
    assert ours.ls_packed
    src, lens, prev = batch(task, left_pad_source=False)
    src[0, 2] = task.source_dictionary.pad()
    features, extra = ours(src, lens, prev, features_only=True, packed_rows=True)
    expected, _ = ref(src, lens, prev, features_only=True)
    m = prev.ne(task.target_dictionary.pad()).unsqueeze(-1)
    assert features.shape == expected.shape and rel_err(features * m, expected * m) < 1e-5


def _sequence_parallel_equals_one_process(P):
    """In each of P ranks: ls_mbart_base (float64, dropouts 0.1) sharded P ways in both exchange modes against
    the one-process run (support.sp); returns the largest relative gradient error."""
    from fairseq_lightseq.criterions.ls_label_smoothed_cross_entropy import LsLabelSmoothedCrossEntropyCriterion
    from support.sp import assert_sharded_equals_one_process, translation_sample

    task = make_bart_task()
    torch.manual_seed(0)
    model = perturb_(build_bart(LSBARTModel, task, dropout=0.1, attention_dropout=0.1, activation_dropout=0.1),
                     0).double()

    def attach(m, sp):
        m.encoder.sequence_parallel = m.decoder.sequence_parallel = sp

    criterion = LsLabelSmoothedCrossEntropyCriterion(task, False, 0.1, report_accuracy=True)
    def sample(d):
        return translation_sample(task, d, (7, 5))

    logged = ("loss", "nll_loss", "ntokens", "nsentences")
    return max(assert_sharded_equals_one_process(model, attach, criterion, sample, P, mode,
                                                 f"ls_mbart_base P={P} {mode}", logged)
               for mode in ("ulysses", "allgather"))


def test_sequence_parallel_equals_one_process():
    from support.dist import run

    worst = max(run(_sequence_parallel_equals_one_process, 2, 2))
    print(f"ls_mbart_base P=2: largest relative gradient error {worst:.3g}")


def test_sequence_parallel_options_are_checked_at_build():
    """A classification head reads one row of one rank: sentence_prediction is refused (so is every criterion
    that does not count a rank's share); without torch.distributed the model runs unsharded."""
    task = make_bart_task()
    with pytest.raises(ValueError, match="--sequence-parallel-size 2 must divide"):
        build_bart(LSBARTModel, task, sequence_parallel_size=2)
    with pytest.raises(ValueError, match="does not support --criterion sentence_prediction"):
        build_bart(LSBARTModel, task, sequence_parallel_size=2, distributed_world_size=2,
                   criterion="sentence_prediction")
    model = build_bart(LSBARTModel, task, sequence_parallel_size=2, distributed_world_size=2,
                       criterion="ls_label_smoothed_cross_entropy")
    assert model.encoder.sequence_parallel is None and not model.ls_packed


def test_encoder_states_hold_no_storage_beyond_what_backward_keeps():
    """BART's forward returns every encoder layer's output (return_all_hiddens=True): in training each is a
    tensor autograd keeps for backward anyway, so the list costs no memory."""
    from scripts.bench_support.saved_bytes import SavedBytes

    task = make_bart_task()
    _, ours = bart_pair(task)
    src, lens, prev = batch(task, B=3, S=7, T=6)
    with SavedBytes(list(ours.parameters())) as saved:
        enc = ours.encoder(src, src_lengths=lens, return_all_hiddens=True)
        out = ours.decoder(prev, encoder_out=enc, features_only=True)[0]
    saved.finish(out)
    states = enc["encoder_states"]
    assert len(states) == len(ours.encoder.layers) + 1
    assert all(t.untyped_storage().data_ptr() in saved._seen for t in states)
