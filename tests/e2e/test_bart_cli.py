"""BART and mBART through fairseq's command line (fairseq-train and fairseq-generate in this process), on the
first sentences of Multi30k En-De (support.bart's data-bins), tiny models (1 layer, width 32), CPU:

* the same seed, the same trajectory: 50 updates, dropout 0, GELU (BART's activation), every ls_ name (arch,
  criterion, optimizer) against fairseq's, max |loss difference| <= 1e-5 for
  - BART pretraining (`denoising`, ls_bart_base vs bart_base) on the English side,
  - mBART pretraining (`multilingual_denoising` on en + de with language tokens, ls_mbart_base vs mbart_base),
  - an en-de fine-tune (`translation_from_pretrained_bart`) from fairseq's own mbart_base pretraining, with
    ls_mbart_base and with mbart_base: fairseq's checkpoint loads into ours as it is,
  - a sentence_prediction fine-tune with BART's classification head (ls_bart_base vs bart_base);
* the ls fine-tune decodes (fairseq-generate, beam 2, mBART's language tokens) the same hypotheses as
  fairseq's own mbart_base model does from the same checkpoint converted to fairseq's names;
* BART's hub interface (BARTModel.from_pretrained) over ours gives fairseq's model's features, head scores,
  mask fillings and samples on the same weights;
* with dropout on, --ls-packed True and False log the same losses;
* bad input: another family's checkpoint for ls_mbart_base: one error naming what it holds.

fairseq's denoising draws part of its noise (span lengths, random tokens) from torch's global generator
while building a batch; its default data-buffer thread builds batches while the main thread trains, so the
noise depends on thread timing and two runs of fairseq alone differ after a few updates. The pretraining runs
here build their batches in the main thread (--data-buffer-size 0). Marked `e2e`."""
import os
import re

import pytest

from support.bart import mbart_data_once
from support.cli import USER_DIR, convert, run
from support.inprocess import train_losses
from support.roberta import roberta_corpus_once

pytestmark = pytest.mark.e2e

UPDATES = 50
TOL = 1e-5  # as the other families' trajectories (tests/e2e/test_same_seed_trajectory.py); measured: r104-r107
TINY = ["--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
        "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2",
        "--decoder-attention-heads", "2", "--max-source-positions", "128", "--max-target-positions", "128"]
NO_DROPOUT = ["--dropout", "0", "--attention-dropout", "0", "--activation-dropout", "0"]
RUN = ["--user-dir", USER_DIR, "--seed", "1", "--cpu", "--num-workers", "0", "--log-format", "json",
       "--log-interval", "1", "--disable-validation", "--no-epoch-checkpoints", "--save-interval", "1000"]
LS = ["--criterion", "ls_label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--optimizer", "ls_adam",
      "--lr", "0.003", "--max-tokens", "512"]
# BART's noise (the paper's: 30% of the words in Poisson(3.5) spans, one mask a span, 10% random tokens)
NOISE = ["--mask", "0.3", "--mask-random", "0.1", "--poisson-lambda", "3.5", "--mask-length", "span-poisson",
         "--replace-length", "1", "--rotate", "0", "--permute-sentences", "0", "--tokens-per-sample", "64",
         "--data-buffer-size", "0"]
MBART = ["--langs", "en,de"]
PAIR = ["--task", "translation_from_pretrained_bart", *MBART, "--source-lang", "en", "--target-lang", "de"]


def native(argv):
    """argv with fairseq's names for ours (ls_mbart_base -> mbart_base, ls_adam -> adam, ...)."""
    return [a[3:] if a.startswith("ls_") else a for a in argv]


def losses(argv, save_dir, impl):
    return train_losses(argv if impl == "ls" else native(argv), save_dir)


def both(tmp_path_factory, name, argv_of):
    """{impl: (losses, save_dir)} for "ls" and "native" of argv_of(save_dir) (fairseq's names for native)."""
    out = {}
    for impl in ("ls", "native"):
        save_dir = str(tmp_path_factory.mktemp(f"{name}_{impl}"))
        out[impl] = losses(argv_of(save_dir), save_dir, impl), save_dir
    return out


def fresh(tmp_path, name: str) -> str:
    """An empty folder tmp_path/name (a run's --save-dir)."""
    os.makedirs(tmp_path / name)
    return str(tmp_path / name)


def finetune_args(data, pretrained, save_dir, *extra, updates=UPDATES):
    return [data["pair"], *PAIR, "--arch", "ls_mbart_base", *TINY, *LS, *RUN, "--max-update", str(updates),
            "--restore-file", pretrained, "--reset-optimizer", "--reset-dataloader", "--reset-meters",
            "--save-dir", save_dir, *extra]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return mbart_data_once(tmp_path_factory)


@pytest.fixture(scope="module")
def denoising(tmp_path_factory, data):
    return both(tmp_path_factory, "denoising", lambda save: [
        data["en"], "--task", "denoising", "--arch", "ls_bart_base", *TINY, *NO_DROPOUT, *NOISE, *LS, *RUN,
        "--max-update", str(UPDATES), "--save-dir", save])


@pytest.fixture(scope="module")
def pretraining(tmp_path_factory, data):
    return both(tmp_path_factory, "mbart", lambda save: [
        data["mono"], "--task", "multilingual_denoising", *MBART, "--add-lang-token", "--arch", "ls_mbart_base",
        *TINY, *NO_DROPOUT, *NOISE, *LS, *RUN, "--max-update", str(UPDATES), "--save-dir", save])


@pytest.fixture(scope="module")
def pretrained(pretraining):
    """fairseq's own mbart_base checkpoint after its multilingual_denoising pretraining."""
    return os.path.join(pretraining["native"][1], "checkpoint_last.pt")


@pytest.fixture(scope="module")
def finetuning(tmp_path_factory, data, pretrained):
    return both(tmp_path_factory, "finetune", lambda save: finetune_args(data, pretrained, save, *NO_DROPOUT))


@pytest.fixture(scope="module")
def sentence_prediction(tmp_path_factory):
    d = roberta_corpus_once(tmp_path_factory)
    runs = both(tmp_path_factory, "bart_sp", lambda save: [
        os.path.join(d, "ft"), "--task", "sentence_prediction", "--add-prev-output-tokens", "--num-classes", "2",
        "--init-token", "0", "--separator-token", "2", "--max-positions", "64", "--arch", "ls_bart_base", *TINY,
        *NO_DROPOUT, "--criterion", "sentence_prediction", "--optimizer", "ls_adam", "--lr", "0.002",
        "--max-tokens", "512", *RUN, "--max-update", str(UPDATES), "--save-dir", save])
    runs["corpus"] = d
    return runs


@pytest.mark.parametrize("case", ["denoising", "pretraining", "finetuning", "sentence_prediction"])
def test_losses_are_fairseqs(request, case):
    runs = request.getfixturevalue(case)
    ours, theirs = runs["ls"][0], runs["native"][0]
    assert len(ours) == len(theirs) == UPDATES
    diff = max(abs(a - b) for a, b in zip(ours, theirs))
    print(f"{case}, {UPDATES} updates: max |ls - native| loss {diff:.2e}; first {ours[0]:.6f} vs "
          f"{theirs[0]:.6f}, last {ours[-1]:.6f} vs {theirs[-1]:.6f}")
    assert ours[-1] < ours[0] - 0.5
    assert diff <= TOL


def test_finetuned_ls_model_decodes_as_fairseqs_model(data, finetuning, tmp_path):
    """The ls fine-tune's checkpoint, decoded with the plugin, and the same weights under fairseq's names
    (scripts/convert_checkpoint.py --to fairseq: fairseq's own BARTModel builds and decodes it) give the same
    hypotheses and scores. Both decodes run fairseq-generate's translation_from_pretrained_bart, which needs
    the plugin's fix of that task (patches/pretrained_bart_task.py) with any model."""
    checkpoint = os.path.join(finetuning["ls"][1], "checkpoint_last.pt")
    converted = str(tmp_path / "fairseq.pt")
    convert(checkpoint, converted, "fairseq", str(tmp_path))
    ours, theirs = (hypotheses(data, path, str(tmp_path)) for path in (checkpoint, converted))
    # a beam without a finished hypothesis prints none: after 50 updates some test sentences end so
    assert len(ours) >= 6 and ours.keys() == theirs.keys()
    assert {i: h for i, (_, h) in ours.items()} == {i: h for i, (_, h) in theirs.items()}
    assert max(abs(ours[i][0] - theirs[i][0]) for i in ours) < 1e-4
    assert any(h for _, h in ours.values())


def hypotheses(data, path, cwd):
    """{sentence id: (score, hypothesis)} of fairseq-generate on the test split of the en-de data-bin (beam 2,
    the task's language tokens)."""
    _, out = run(["fairseq-generate", data["pair"], "--path", path, *PAIR, "--gen-subset", "test", "--beam", "2",
                  "--max-len-b", "30", "--batch-size", "64", "--cpu", "--num-workers", "0", "--user-dir", USER_DIR],
                 cwd)
    found = (re.match(r"^H-(\d+)\t(\S+)\t(.*)$", line) for line in out.splitlines())
    return {int(m.group(1)): (float(m.group(2)), m.group(3)) for m in found if m}


def test_finetune_options(data, pretrained, finetuning, tmp_path):
    """--ls-recompute-attention False keeps q, k, v instead of projecting them again, --checkpoint-activations
    runs each layer's forward again in backward: the same losses as the default run; --bf16 and --fp16 train
    (losses near fp32's)."""
    def first(*extra):
        save = fresh(tmp_path, extra[0].strip("-"))
        return train_losses(finetune_args(data, pretrained, save, *NO_DROPOUT, *extra, updates=3), save)

    default = finetuning["ls"][0][:3]
    assert first("--ls-recompute-attention", "False") == pytest.approx(default, abs=1e-6)
    assert first("--checkpoint-activations") == pytest.approx(default, abs=1e-6)
    assert first("--bf16") == pytest.approx(default, abs=0.1)
    assert first("--fp16") == pytest.approx(default, abs=0.1)


def test_packed_and_padded_losses_match_with_dropout(data, pretrained, tmp_path, monkeypatch):
    """The fine-tune with dropout 0.1 and attention dropout 0.1, --ls-packed True and False (the packed
    attention runs in the packed run only)."""
    from fairseq_lightseq.modules.transformer_layer import TransformerLayerBase

    original, calls = TransformerLayerBase._attention_packed, []
    monkeypatch.setattr(TransformerLayerBase, "_attention_packed",
                        lambda self, *a, **k: calls.append(1) or original(self, *a, **k))
    runs = {}
    for packed in (False, True):
        save, before = fresh(tmp_path, str(packed)), len(calls)
        runs[packed] = train_losses(finetune_args(data, pretrained, save, "--dropout", "0.1", "--attention-dropout",
                                                  "0.1", "--ls-packed", str(packed), updates=30), save)
        assert (len(calls) > before) == packed
    rel = max(abs(a - b) / abs(b) for a, b in zip(runs[True], runs[False]))
    print(f"30 updates, dropout 0.1: max relative |packed - padded| loss {rel:.2e}")
    assert len(runs[True]) == 30 and rel < 1e-5


def test_another_familys_checkpoint_is_refused(data, tmp_path):
    """A language model's checkpoint (fairseq-train's language_modeling on the same English data) restored
    into ls_mbart_base."""
    lm = str(tmp_path / "lm")
    run(["fairseq-train", data["en"], "--task", "language_modeling", "--arch", "transformer_lm", "--decoder-layers",
         "1", "--decoder-embed-dim", "16", "--decoder-ffn-embed-dim", "16", "--decoder-attention-heads", "2",
         "--tokens-per-sample", "32", "--optimizer", "adam", "--lr", "0.001", "--max-tokens", "256", *RUN,
         "--max-update", "1", "--save-dir", lm], str(tmp_path))
    rc, out = run(["fairseq-train", *finetune_args(data, os.path.join(lm, "checkpoint_last.pt"),
                                                   str(tmp_path / "ft"), updates=1)], str(tmp_path), check=False)
    assert rc == 1 and "ls_bart: the checkpoint's weights are a decoder-only model's" in out, out[-3000:]
    assert "Traceback" not in out, out[-3000:]  # a refusal: its line alone


@pytest.fixture(scope="module")
def char_denoising(tmp_path_factory, sentence_prediction):
    """ls_bart_base pretrained (denoising, 30 updates) on the sentence_prediction corpus' text (characters)."""
    d = sentence_prediction["corpus"]
    save = str(tmp_path_factory.mktemp("char_denoising"))
    train_losses([os.path.join(d, "mlm"), "--task", "denoising", "--arch", "ls_bart_base", *TINY, *NO_DROPOUT,
                  *NOISE, *LS, *RUN, "--max-update", "30", "--save-dir", save], save)
    return save


def hubs(save_dir, data, tmp_path):
    """BARTModel.from_pretrained (fairseq's BARTHubInterface, BPE `characters`) over save_dir's checkpoint_last.pt
    and over the same weights under fairseq's names: (ours, fairseq's), in eval mode."""
    from fairseq.models.bart import BARTModel
    from fairseq_lightseq.models.ls_bart import LSBARTModel

    convert(os.path.join(save_dir, "checkpoint_last.pt"), str(tmp_path / "fairseq.pt"), "fairseq", str(tmp_path))
    ours, theirs = (BARTModel.from_pretrained(folder, checkpoint_file=name, data_name_or_path=data,
                                              bpe="characters").eval()
                    for folder, name in ((save_dir, "checkpoint_last.pt"), (str(tmp_path), "fairseq.pt")))
    assert isinstance(ours.model, LSBARTModel) and not isinstance(theirs.model, LSBARTModel)
    return ours, theirs


def test_hub_features_and_predict_on_ours_match_fairseqs(sentence_prediction, tmp_path):
    """The sentence_prediction checkpoint through the hub: the same features and class scores of its
    classification head."""
    import torch

    ours, theirs = hubs(sentence_prediction["ls"][1], os.path.join(sentence_prediction["corpus"], "ft"), tmp_path)
    tokens = ours.encode("the cat sat on a mat")
    assert torch.equal(tokens, theirs.encode("the cat sat on a mat"))
    with torch.no_grad():
        features = [h.extract_features(tokens) for h in (ours, theirs)]
        assert features[0].shape == (1, len(tokens), 32) and torch.allclose(*features, atol=1e-5)
        scores = [h.predict("sentence_classification_head", tokens) for h in (ours, theirs)]
        assert scores[0].shape == (1, 2) and torch.allclose(*scores, atol=1e-5)


def test_hub_fill_mask_and_sample_on_ours_match_fairseqs(sentence_prediction, char_denoising, tmp_path):
    """The denoising checkpoint through the hub (its task builds the inference data): the same mask fillings
    and samples."""
    ours, theirs = hubs(char_denoising, os.path.join(sentence_prediction["corpus"], "mlm"), tmp_path)
    fills = [h.fill_mask(["the cat <mask> on a mat"], topk=2) for h in (ours, theirs)]
    assert [[t for t, _ in f] for f in fills[0]] == [[t for t, _ in f] for f in fills[1]]
    assert len(fills[0][0]) == 2
    samples = [h.sample(["the cat sat"], beam=2, max_len_b=10) for h in (ours, theirs)]
    assert samples[0] == samples[1] and isinstance(samples[0][0], str)
