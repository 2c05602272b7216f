"""--ls-packed: the packed forward and backward equal the padded ones (float64, every dropout on, the same
seed: the packed rows draw the padded run's masks), for each model family, through our criteria, on both
packed paths: the one-node blocks (ops.blocks.packed_attention_block, feed_forward_block with a row map) and the
per-op chain (autocast, devices or dtypes without kernels).

Each case runs one training step's loss and gradients twice on the same weights and batch, padded
(ls_packed False) then packed (True), after the same torch.manual_seed, and compares the losses and every
parameter's gradient (rtol 1e-10; the key biases, zero in exact arithmetic, against the largest gradient)."""
import argparse

import pytest
import torch

from support.models import build, make_task, perturb_
from support.roberta import build_roberta, make_mlm_task, perturb_roberta_
from support.lm import build_lm, perturb_lm_
from fairseq.data import Dictionary, MonolingualDataset, TokenBlockDataset
from fairseq.data.list_dataset import ListDataset
from fairseq_lightseq.criterions.ls_cross_entropy import LsCrossEntropyCriterion
from fairseq_lightseq.criterions.ls_label_smoothed_cross_entropy import LsLabelSmoothedCrossEntropyCriterion
from fairseq_lightseq.criterions.ls_masked_lm import LsMaskedLmConfig, LsMaskedLmLoss
from fairseq_lightseq.models.ls_roberta import LSRobertaModel
from fairseq_lightseq.models.ls_transformer import LSTransformerModel
from fairseq_lightseq.models.ls_transformer_lm import LSTransformerLanguageModel
from fairseq_lightseq.modules import packing
from fairseq_lightseq.modules.transformer_layer import TransformerLayerBase

DROPOUT = dict(dropout=0.1, attention_dropout=0.1, activation_dropout=0.1)
RTOL = 1e-10

# lengths of the rows of one batch (source, target): a length-1 row, one long row among short ones, and
# equal lengths (no padding: the padded path runs, packed or not)
BATCHES = {
    "mixed": ([7, 1, 3, 2], [5, 2, 1, 4]),
    "one_long": ([9, 2, 2], [8, 1, 2]),
    "no_padding": ([4, 4, 4], [3, 3, 3]),
    "batch_of_one": ([5], [4]),
}


@pytest.fixture(autouse=True, params=["blocks", "chain"])
def packed_path(request, monkeypatch):
    """Every test of this file runs with the packed layers as one-node blocks, then as the per-op chain."""
    if request.param == "chain":
        original = TransformerLayerBase._use_blocks
        monkeypatch.setattr(TransformerLayerBase, "_use_blocks",
                            lambda self, x, packed=False: not packed and original(self, x))
    return request.param


def _step(model, criterion, sample, packed: bool):
    """(loss, {name: grad}, logging output) of one forward + backward, ls_packed set to `packed`, the dropout
    seed fixed."""
    model.ls_packed = packed
    model.zero_grad()
    torch.manual_seed(1234)
    loss, _, log = criterion(model, sample)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, log


def _assert_same(model, criterion, sample, packs=True):
    """Packed and padded give the same loss, counts and gradients; the packed attention ran iff the batch
    has padding (and `packs`: the criterion reads only real rows), and a run without it gives exactly the
    padded numbers."""
    loss0, g0, log0 = _step(model, criterion, sample, False)
    calls = []
    original = TransformerLayerBase._attention_packed
    TransformerLayerBase._attention_packed = lambda self, *a, **k: calls.append(1) or original(self, *a, **k)
    try:
        loss1, g1, log1 = _step(model, criterion, sample, True)
    finally:
        TransformerLayerBase._attention_packed = original
    ran_packed = packs and any(t.eq(1).any() for k, t in sample["net_input"].items() if k.endswith("tokens"))
    assert bool(calls) == ran_packed
    if not ran_packed:
        assert torch.equal(loss1, loss0) and all(torch.equal(g1[n], g) for n, g in g0.items())
    torch.testing.assert_close(loss1, loss0, rtol=RTOL, atol=0)
    assert g1.keys() == g0.keys() and g0
    top = max(float(g.abs().max()) for g in g0.values())
    for name, g in g0.items():
        if name.endswith("k_proj.bias"):  # zero in exact arithmetic: rounding noise on both sides
            assert float(g1[name].abs().max()) < RTOL * top, name
        else:
            torch.testing.assert_close(g1[name], g, rtol=RTOL, atol=RTOL * top, msg=name)
    for key in ("ntokens", "nsentences", "sample_size"):
        assert log1[key] == log0[key]
    return loss0


def _rows(d: Dictionary, lengths, left_pad: bool, g):
    """[B, max(lengths)] int64: random words, padded on the left or on the right."""
    T = max(lengths)
    out = torch.full((len(lengths), T), d.pad())
    for b, n in enumerate(lengths):
        row = torch.randint(d.nspecial, len(d), (n,), generator=g)
        if left_pad:
            out[b, T - n:] = row
        else:
            out[b, :n] = row
    return out


def _translation_sample(task, batch: str, left_pad_source: bool):
    src_len, tgt_len = BATCHES[batch]
    g = torch.Generator().manual_seed(7)
    src = _rows(task.source_dictionary, src_len, left_pad_source, g)
    d = task.target_dictionary
    tgt = _rows(d, tgt_len, False, g)
    prev = torch.cat([torch.full((tgt.size(0), 1), d.eos()), tgt[:, :-1]], 1).masked_fill(tgt.eq(d.pad()), d.pad())
    return {"net_input": {"src_tokens": src, "src_lengths": src.ne(d.pad()).sum(1), "prev_output_tokens": prev},
            "target": tgt, "ntokens": int(tgt.ne(d.pad()).sum()), "nsentences": tgt.size(0)}


@pytest.mark.parametrize("batch", list(BATCHES))
@pytest.mark.parametrize("left_pad_source", [True, False], ids=["left_src", "right_src"])
def test_translation_packed_equals_padded(batch, left_pad_source):
    task = make_task()
    torch.manual_seed(0)
    model = perturb_(build(LSTransformerModel, task, share_all_embeddings=True, **DROPOUT)).double().train()
    criterion = LsLabelSmoothedCrossEntropyCriterion(task, False, 0.1, report_accuracy=True)
    _assert_same(model, criterion, _translation_sample(task, batch, left_pad_source))


@pytest.mark.parametrize("batch", ["mixed", "one_long"])
def test_ignore_prefix_runs_packed_with_fairseqs_loss(batch):
    """--ignore-prefix-size 2 (whole targets of 1 and 2 tokens among the rows): our criterion runs the packed
    rows (the prefix's targets ignored) with the padded run's loss and gradients, and they are fairseq's
    label_smoothed_cross_entropy's (the padded logits, their first columns cut), accuracy counts included."""
    from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion

    task = make_task()
    torch.manual_seed(0)
    model = perturb_(build(LSTransformerModel, task, share_all_embeddings=True, **DROPOUT)).double().train()
    sample = _translation_sample(task, batch, True)
    ours = LsLabelSmoothedCrossEntropyCriterion(task, False, 0.1, ignore_prefix_size=2, report_accuracy=True)
    _assert_same(model, ours, sample)  # the packed attention ran, with the padded run's numbers
    loss, grads, log = _step(model, ours, sample, True)
    fairseqs = LabelSmoothedCrossEntropyCriterion(task, False, 0.1, ignore_prefix_size=2, report_accuracy=True)
    loss_fs, grads_fs, log_fs = _step(model, fairseqs, sample, True)
    # fairseq's criterion takes its log-softmax in fp32 (utils.log_softmax casts): test_criterion's tolerances
    torch.testing.assert_close(loss, loss_fs.double(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(log["nll_loss"], log_fs["nll_loss"].double(), rtol=1e-5, atol=1e-5)
    assert (log["n_correct"], log["total"]) == (log_fs["n_correct"], log_fs["total"])
    for name, g in grads_fs.items():
        torch.testing.assert_close(grads[name], g, rtol=1e-4, atol=1e-6, msg=name)


def test_fairseqs_criteria_get_fairseqs_outputs():
    """fairseq's own label_smoothed_cross_entropy and cross_entropy read the logits [B, T, V], pad rows
    included: the packed model runs its padded path for them (no packed attention), so every output is fairseq's."""
    from fairseq.criterions.cross_entropy import CrossEntropyCriterion
    from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion

    task = make_task()
    torch.manual_seed(0)
    model = perturb_(build(LSTransformerModel, task, **DROPOUT)).double().train()
    lm = perturb_lm_(build_lm(LSTransformerLanguageModel, task, **DROPOUT)).double().train()
    for m, criterion, sample in ((model, LabelSmoothedCrossEntropyCriterion(task, False, 0.1),
                                  _translation_sample(task, "mixed", True)),
                                 (lm, CrossEntropyCriterion(task, False), _lm_sample(task.source_dictionary, "eos"))):
        _assert_same(m, criterion, sample, packs=False)


@pytest.mark.parametrize("variant", ["pre_ln_separate", "post_ln_learned_layernorm_embedding"])
def test_translation_variants_packed_equal_padded(variant):
    """Separate dictionaries and embeddings with pre-LN and --checkpoint-activations; learned positions, --layernorm-embedding and no
    embedding scale with post-LN; --decoder-output-dim projections."""
    if variant == "pre_ln_separate":
        task = make_task(joined=False)
        options = dict(encoder_normalize_before=True, decoder_normalize_before=True, checkpoint_activations=True)
    else:
        task = make_task()
        options = dict(encoder_learned_pos=True, decoder_learned_pos=True, layernorm_embedding=True,
                       no_scale_embedding=True, decoder_output_dim=12)
    torch.manual_seed(0)
    model = perturb_(build(LSTransformerModel, task, **options, **DROPOUT)).double().train()
    criterion = LsLabelSmoothedCrossEntropyCriterion(task, False, 0.1)
    _assert_same(model, criterion, _translation_sample(task, "mixed", True))


def _lm_sample(d: Dictionary, break_mode: str):
    """A batch of fairseq's language_modeling data path: TokenBlockDataset (--sample-break-mode) and
    MonolingualDataset's collater over sentences of lengths 1-9 (with their </s>), block size 12."""
    g = torch.Generator().manual_seed(3)
    sentences = []
    for n in (6, 1, 9, 3, 2, 5, 4, 8):
        s = torch.randint(d.nspecial, len(d), (n + 1,), generator=g)
        s[-1] = d.eos()
        sentences.append(s)
    sizes = [len(s) for s in sentences]
    blocks = TokenBlockDataset(ListDataset(sentences, sizes), sizes, 12, pad=d.pad(), eos=d.eos(), break_mode=break_mode,
                               include_targets=True)
    data = MonolingualDataset(blocks, blocks.sizes, d, d, add_eos_for_other_targets=False, shuffle=False,
                              targets=["future"])
    sample = data.collater([data[i] for i in range(min(5, len(data)))])
    assert sample["net_input"]["src_tokens"].eq(d.pad()).any()  # the batch has padding
    return sample


@pytest.mark.parametrize("break_mode", ["eos", "complete"])
def test_language_model_packed_equals_padded(break_mode):
    task = make_task()
    torch.manual_seed(0)
    model = perturb_lm_(build_lm(LSTransformerLanguageModel, task, **DROPOUT)).double().train()
    criterion = LsCrossEntropyCriterion(task, False)
    _assert_same(model, criterion, _lm_sample(task.source_dictionary, break_mode))


def _roberta():
    task = make_mlm_task()
    torch.manual_seed(0)
    model = build_roberta(LSRobertaModel, task, **DROPOUT)
    model.register_classification_head("cls", num_classes=3)
    return task, perturb_roberta_(model).double().train()


def test_masked_lm_packed_equals_padded():
    from support.roberta import mlm_sample

    task, model = _roberta()
    _assert_same(model, LsMaskedLmLoss(LsMaskedLmConfig(tpu=False), task), mlm_sample(task, B=4, T=9))


def test_sentence_prediction_packed_equals_padded():
    """fairseq's own sentence_prediction criterion: the model packs inside its forward (a classification
    head's forward), the head reads each sentence's first row."""
    from fairseq.criterions.sentence_prediction import SentencePredictionConfig, SentencePredictionCriterion
    from support.roberta import mlm_sample

    task, model = _roberta()
    sample = mlm_sample(task, B=4, T=9, mask_every=0)
    sample["target"] = torch.tensor([[0], [2], [1], [2]])
    task.label_dictionary = None
    criterion = SentencePredictionCriterion(SentencePredictionConfig(classification_head_name="cls"), task)
    _assert_same(model, criterion, sample)


def test_left_padded_classification_runs_padded():
    """A classification head reads position 0, padding in a left-padded row: the padded path runs."""
    from fairseq.criterions.sentence_prediction import SentencePredictionConfig, SentencePredictionCriterion
    from support.roberta import mlm_sample

    task, model = _roberta()
    sample = mlm_sample(task, B=4, T=9, mask_every=0)
    tokens = sample["net_input"]["src_tokens"]
    sample["net_input"]["src_tokens"] = torch.stack([r.roll(int(r.eq(1).sum())) for r in tokens])  # left padded
    sample["target"] = torch.tensor([[0], [2], [1], [2]])
    task.label_dictionary = None
    criterion = SentencePredictionCriterion(SentencePredictionConfig(classification_head_name="cls"), task)
    _assert_same(model, criterion, sample, packs=False)


def test_packing_layout():
    """Packing of a left- and right-padded mask: rows in sentence order, positions in order; the time-major
    rows and dropout coordinates of the padded problem; an empty row; a row with a gap is refused."""
    mask = torch.tensor([[True, True, False, False], [False, False, False, True], [True, True, True, True]])
    p = packing.pack(mask)
    assert (p.N, p.B, p.T, p.max_len) == (5, 3, 4, 3)
    assert p.lengths == (2, 3, 0) and p.first == (2, 0, 0)
    assert p.index.tolist() == [2, 3, 4, 5, 6]
    assert p.rows.tolist() == [2 * 3 + 0, 3 * 3 + 0, 0 * 3 + 1, 1 * 3 + 1, 2 * 3 + 1]
    assert p.cu_seqlens.tolist() == [0, 2, 5, 5] and p.cu_seqlens.dtype == torch.int32
    x = torch.arange(12.0).view(3, 4, 1)
    assert p.gather(x).view(-1).tolist() == [2, 3, 4, 5, 6]
    c = packing.coords(p, p)
    assert (c.Tq, c.Tk) == (4, 4) and c.starts.tolist() == [[2, 2], [0, 0], [0, 0]]
    with pytest.raises(ValueError, match="row 0 .*padding between"):
        packing.pack(torch.tensor([[False, True, False]]))
    assert p.first_rows() is None  # row 0 starts at position 2, row 2 is empty
    assert packing.pack(mask[1:2]).first_rows().tolist() == [0]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
def test_translation_packed_equals_padded_on_cuda(dtype):
    """On CUDA the padded run takes the explicit attention (--ls-attention explicit: SDPA's dropout draws
    from torch's generator), so both runs draw every mask from the Philox stream; fp32 within 1e-4, half
    precision within its rounding."""
    from fairseq_lightseq.models.common import set_attention_mode

    task = make_task()
    torch.manual_seed(0)
    model = perturb_(build(LSTransformerModel, task, share_all_embeddings=True, **DROPOUT)).to("cuda", dtype).train()
    set_attention_mode(model, "explicit")
    criterion = LsLabelSmoothedCrossEntropyCriterion(task, False, 0.1)
    sample = _translation_sample(task, "mixed", True)
    sample["net_input"] = {k: v.cuda() for k, v in sample["net_input"].items()}
    sample["target"] = sample["target"].cuda()
    (loss0, g0, _), (loss1, g1, _) = (_step(model, criterion, sample, p) for p in (False, True))
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(loss1.float(), loss0.float(), rtol=tol, atol=0)
    top = max(float(g.float().abs().max()) for g in g0.values())
    for name, g in g0.items():
        if not name.endswith("k_proj.bias"):
            torch.testing.assert_close(g1[name].float(), g.float(), rtol=tol, atol=tol * top, msg=name)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("recompute", [False, True], ids=["keep", "recompute"])
def test_translation_packed_on_flash_equals_padded_on_cuda(dtype, recompute, packed_path, monkeypatch):
    """--ls-attention auto on CUDA in half precision: packed rows run torch's flash varlen kernel (every packed
    attention calls it), the padded run SDPA; without attention dropout (the one mask torch draws) the two agree
    within half precision's rounding, with every other dropout on."""
    from fairseq_lightseq.ops import flash_attention
    from fairseq_lightseq.ops.blocks import flash_packed_attention

    calls = []
    original = flash_attention.flash_forward

    def counted(*args):
        calls.append(1)
        return original(*args)
    for module in (flash_attention, flash_packed_attention):  # the chain's Function and the block call it
        monkeypatch.setattr(module, "flash_forward", counted)
    task = make_task()
    torch.manual_seed(0)
    model = perturb_(build(LSTransformerModel, task, share_all_embeddings=True, encoder_embed_dim=64,
                           encoder_attention_heads=1, decoder_attention_heads=1, ls_recompute_attention=recompute,
                           **{**DROPOUT, "attention_dropout": 0.0}))
    model = model.to("cuda", dtype).train()
    criterion = LsLabelSmoothedCrossEntropyCriterion(task, False, 0.1)
    sample = _translation_sample(task, "mixed", True)
    sample["net_input"] = {k: v.cuda() for k, v in sample["net_input"].items()}
    sample["target"] = sample["target"].cuda()
    loss0, g0, _ = _step(model, criterion, sample, False)
    assert not calls
    loss1, g1, _ = _step(model, criterion, sample, True)
    # 2 encoder + 2 x 2 decoder attentions; the blocks' recompute reruns each in backward (the chain keeps them)
    assert len(calls) == 6 * (2 if recompute and packed_path == "blocks" else 1)
    torch.testing.assert_close(loss1.float(), loss0.float(), rtol=3e-2, atol=0)
    top = max(float(g.float().abs().max()) for g in g0.values())
    for name, g in g0.items():
        if not name.endswith("k_proj.bias"):
            torch.testing.assert_close(g1[name].float(), g.float(), rtol=3e-2, atol=3e-2 * top, msg=name)


def test_packed_option_with_sequence_parallelism():
    """The default is off under sequence parallelism (its shards are padded rows); True is refused there."""
    from fairseq_lightseq.models.common import PACKED_DEFAULTS, packed_option

    for name, default in PACKED_DEFAULTS.items():
        assert packed_option(argparse.Namespace(), name) is default
        assert packed_option(argparse.Namespace(sequence_parallel_size=2), name) is False
        assert packed_option(argparse.Namespace(sequence_parallel_size=2, ls_packed=False), name) is False
        with pytest.raises(ValueError, match="--ls-packed True does not combine with --sequence-parallel-size 2"):
            packed_option(argparse.Namespace(sequence_parallel_size=2, ls_packed=True), name)
