"""RoBERTa through fairseq's own tools: masked-LM pretraining with fairseq-train for ls_roberta +
ls_masked_lm + ls_adam and for fairseq's roberta + masked_lm + adam; checkpoints converted both ways;
the hub interface (from_pretrained, encode, extract_features, fill_mask, predict with a registered head)
on our checkpoint equal to the native model on the converted one; sentence_prediction fine-tuning
(classification and --regression-target) from a pretrained ls or native checkpoint with fairseq's GLUE
flags (--restore-file ... --reset-optimizer --reset-dataloader --reset-meters); one SGD update with
--sequence-parallel-size 2 (ulysses, dropout on, --max-positions 600) moving every parameter as one
process does, and sentence_prediction refused under it. The corpus is written in
characters (fairseq's `characters` BPE, so the hub's encode needs no model file). Tiny models (1 layer,
width 32), CPU. Marked `e2e`."""
import os
import re

import pytest
import torch

from support.cli import USER_DIR, by_hand, checkpoint_params, convert, losses, run
from support.recipe import train_inner
from support.roberta import roberta_corpus_once

pytestmark = pytest.mark.e2e

MODEL = ["--encoder-layers", "1", "--encoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
         "--encoder-attention-heads", "2"]
LS = ["--user-dir", USER_DIR, "--arch", "ls_roberta", "--optimizer", "ls_adam"]
# fairseq's own model, criterion and optimizer; the plugin is loaded only for numpy_compat (fairseq's
# TokenBlockDataset with --sample-break-mode eos needs np.compat.long, gone in numpy 2)
NATIVE = ["--user-dir", USER_DIR, "--arch", "roberta", "--optimizer", "adam"]
COMMON = [*MODEL, "--dropout", "0.1", "--attention-dropout", "0.1", "--max-tokens", "512", "--seed", "1", "--cpu",
          "--num-workers", "0", "--no-epoch-checkpoints", "--log-format", "json", "--log-interval", "1"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """support.roberta's corpus: the pretraining data-bin mlm/ and the fine-tuning one ft/."""
    return roberta_corpus_once(tmp_path_factory)


def pretrain(d, stack, criterion, save_dir, updates=20, *extra):
    return run(["fairseq-train", "mlm", "--task", "masked_lm", *stack, "--criterion", criterion, *COMMON,
                "--tokens-per-sample", "64", "--sample-break-mode", "eos", "--lr", "0.003",
                "--max-update", str(updates), "--save-dir", save_dir, *extra], d)[1]


def finetune(d, stack, restore, save_dir, regression=False, updates=44):
    task = ["--num-classes", "1", "--regression-target"] if regression else \
        ["--num-classes", "2", "--best-checkpoint-metric", "accuracy", "--maximize-best-checkpoint-metric"]
    return run(["fairseq-train", "ft", "--task", "sentence_prediction", *stack, "--criterion", "sentence_prediction",
                *task, *COMMON, "--init-token", "0", "--separator-token", "2", "--max-positions", "64",
                "--restore-file", restore, "--reset-optimizer", "--reset-dataloader", "--reset-meters",
                "--lr", "0.002", "--max-update", str(updates), "--save-dir", save_dir], d)[1]


@pytest.fixture(scope="module")
def pretrained(corpus):
    """ls and native pretraining (20 updates each), each converted to the other implementation."""
    d = corpus
    logs = {"ls": pretrain(d, LS, "ls_masked_lm", "ls"), "native": pretrain(d, NATIVE, "masked_lm", "native")}
    convert(os.path.join(d, "ls/checkpoint_last.pt"), os.path.join(d, "ls_as_native.pt"), "fairseq", d)
    convert(os.path.join(d, "native/checkpoint_last.pt"), os.path.join(d, "native_as_ls.pt"), "lightseq", d)
    return d, logs


def test_pretraining_lowers_the_loss_for_both(pretrained):
    _, logs = pretrained
    for name, log in logs.items():
        xs = losses(log)
        assert len(xs) == 20 and sum(xs[-3:]) / 3 < sum(xs[:3]) / 3 - 0.5, (name, xs)
        assert '"valid_loss"' in log, name
    first = {name: losses(log)[0] for name, log in logs.items()}
    assert abs(first["ls"] - first["native"]) < 0.5, first  # same task, same start (log2 V): not a random pick


def test_converted_checkpoints_record_the_other_names(pretrained):
    d, _ = pretrained
    native = torch.load(os.path.join(d, "ls_as_native.pt"), weights_only=False)
    assert native["cfg"]["model"].arch == "roberta" and native["cfg"]["criterion"]["_name"] == "masked_lm"
    assert native["optimizer_history"][-1]["criterion_name"] == "MaskedLmLoss"
    ls = torch.load(os.path.join(d, "native_as_ls.pt"), weights_only=False)
    assert ls["cfg"]["model"].arch == "ls_roberta" and ls["cfg"]["criterion"]["_name"] == "ls_masked_lm"


def _hubs(d, ours_dir, ours_file, native_file, data):
    from fairseq.models.roberta import RobertaModel

    import fairseq_lightseq  # noqa: F401
    from fairseq_lightseq.models.ls_roberta import LSRobertaModel

    ours = LSRobertaModel.from_pretrained(os.path.join(d, ours_dir), ours_file, os.path.join(d, data),
                                          bpe="characters").eval()
    native = RobertaModel.from_pretrained(d, native_file, os.path.join(d, data), bpe="characters").eval()
    assert type(ours.model) is LSRobertaModel and type(native.model) is RobertaModel
    return ours, native


def _assert_same_fill(ours, native, masked="the big d<mask>g sat"):
    filled, expected = ours.fill_mask(masked, topk=3), native.fill_mask(masked, topk=3)
    assert [f[0] for f in filled] == [e[0] for e in expected]
    torch.testing.assert_close(torch.tensor([f[1] for f in filled]), torch.tensor([e[1] for e in expected]),
                               rtol=1e-5, atol=1e-6)


def test_hub_on_ours_equals_the_native_model(pretrained):
    d, _ = pretrained
    ours, native = _hubs(d, "ls", "checkpoint_last.pt", "ls_as_native.pt", "mlm")
    sentence = "the big dog sat on a mat"
    tokens = ours.encode(sentence)
    assert torch.equal(tokens, native.encode(sentence)) and ours.decode(tokens) == sentence
    torch.testing.assert_close(ours.extract_features(tokens), native.extract_features(tokens), rtol=1e-5, atol=1e-5)
    for a, b in zip(ours.extract_features(tokens, return_all_hiddens=True),
                    native.extract_features(tokens, return_all_hiddens=True)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    _assert_same_fill(ours, native)
    # and the other way: fairseq's checkpoint converted to ours
    ours, native = _hubs(d, ".", "native_as_ls.pt", "native/checkpoint_last.pt", "mlm")
    torch.testing.assert_close(ours.extract_features(tokens), native.extract_features(tokens), rtol=1e-5, atol=1e-5)
    _assert_same_fill(ours, native)


@pytest.fixture(scope="module")
def finetuned(pretrained):
    """Classification fine-tuned by ls_roberta from our pretrained checkpoint."""
    d, _ = pretrained
    logs = {"from_ls": finetune(d, LS, "ls/checkpoint_last.pt", "ft_ls")}
    convert(os.path.join(d, "ft_ls/checkpoint_last.pt"), os.path.join(d, "ft_ls_as_native.pt"), "fairseq", d)
    return d, logs


def test_classification_finetune_from_an_ls_checkpoint(finetuned):
    d, logs = finetuned
    for name, log in logs.items():
        assert "Loaded checkpoint " in log, name
        rows = train_inner(log)
        assert [int(r["num_updates"]) for r in rows] == list(range(1, 45)), name  # --reset-optimizer: from 0
        xs = losses(log)
        assert sum(xs[-3:]) / 3 < sum(xs[:3]) / 3 - 0.5, (name, xs)
        # the label (does the sentence start with "the") is learnt: the last validation's accuracy
        accuracy = [float(v) for v in re.findall(r'"valid_accuracy": "([\d.]+)"', log)]
        assert accuracy and accuracy[-1] >= 90, (name, accuracy)


def test_hub_predict_with_the_registered_head(finetuned):
    d, _ = finetuned
    ours, native = _hubs(d, "ft_ls", "checkpoint_last.pt", "ft_ls_as_native.pt", "ft")
    assert "sentence_classification_head" in ours.model.classification_heads
    tokens = ours.encode("the red cat ran")
    torch.testing.assert_close(ours.predict("sentence_classification_head", tokens),
                               native.predict("sentence_classification_head", tokens), rtol=1e-5, atol=1e-5)


def test_regression_finetune_from_a_native_checkpoint(pretrained):
    """fairseq's own roberta checkpoint, unconverted (same weights; --restore-file reads only them)."""
    d, _ = pretrained
    log = finetune(d, LS, "native/checkpoint_last.pt", "ft_reg", regression=True)
    assert "Loaded checkpoint native/checkpoint_last.pt" in log
    rows = train_inner(log)
    assert len(rows) == 44 and "accuracy" not in rows[0]
    xs = losses(log)
    assert sum(xs[-3:]) / 3 < sum(xs[:3]) / 3, xs


def _sgd(d, save_dir, world, *extra):
    """One masked-LM SGD update (lr 1, no momentum, dropouts 0.1); returns the parameters after it."""
    os.makedirs(os.path.join(d, save_dir), exist_ok=True)
    args = ["mlm", "--task", "masked_lm", *LS, "--criterion", "ls_masked_lm", *COMMON, "--activation-dropout", "0.1",
            "--tokens-per-sample", "64", "--sample-break-mode", "eos", "--max-positions", "600", "--optimizer", "sgd",
            "--momentum", "0", "--max-update", "1", "--no-save-optimizer-state", "--save-dir", save_dir, *extra]
    if "--lr" not in extra:
        args += ["--lr", "1.0"]
    if world == 1:
        run(["fairseq-train", *args], d)
    else:
        by_hand(args, world, d)
    return checkpoint_params(os.path.join(d, save_dir))


def test_sequence_parallel_sgd_update_equals_one_process(corpus):
    d = corpus
    start = _sgd(d, "sgd_start", 1, "--lr", "0")
    one = _sgd(d, "sgd_one", 1)
    moved = {k: (one[k] - start[k]).abs().max().item() for k in one}
    # every parameter but the attention's key biases (no gradient in exact arithmetic) moves; BERT's
    # initialisation (std 0.02) leaves the queries' and keys' updates small (~1e-5)
    assert all(m > 1e-6 for k, m in moved.items() if not k.endswith("k_proj.bias")), moved
    # one mode here (the default); tests/fairseq/test_roberta_sequence_parallel.py checks both, exactly
    for mode in ("ulysses",):
        sp = _sgd(d, f"sgd_{mode}", 2, "--sequence-parallel-size", "2", "--sequence-parallel-mode", mode)
        errors = {k: (sp[k] - one[k]).abs().max().item() for k in one}
        relative = {k: errors[k] / moved[k] for k in one if not k.endswith("k_proj.bias")}
        print(f"{mode}: max |SP 2 - 1 process| after one SGD update {max(errors.values()):.3g} "
              f"(largest update {max(moved.values()):.3g}); largest relative to the parameter's update "
              f"{max(relative.values()):.3g}")
        # fp32: a different summation order; a dropout mask differing anywhere gives errors of the
        # update's size
        assert max(errors.values()) <= 1e-6 and max(relative.values()) <= 1e-3, (mode, errors, relative)


def test_sentence_prediction_refused_under_sequence_parallelism(corpus):
    """Two ranks started by hand (one process would be refused for the world size first): each refuses."""
    d = corpus
    ranks = by_hand(["ft", "--task", "sentence_prediction", *LS, "--criterion", "sentence_prediction",
                     "--num-classes", "2", *COMMON, "--init-token", "0", "--max-positions", "64", "--max-update", "1",
                     "--sequence-parallel-size", "2", "--save-dir", "refused"], 2, d, check=False)
    for rc, log in ranks:
        assert rc != 0 and "does not support --criterion sentence_prediction" in log, log[-3000:]
