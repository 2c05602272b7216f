"""--ls-packed through fairseq-train (in this process, fairseq_cli.train.main): with every dropout on (0.1,
attention dropout 0.1) and the same seed, 30 updates packed and padded log the same losses (fp32, 1e-5
relative): the packed rows draw the padded run's dropout masks. Then the two checkpoints decode the same
hypotheses (fairseq-generate, the padded path for both), and each continues training the other way. For

* translation (ls_transformer) on support.cli's corpus, left-padded sources (fairseq's default);
* the language model (ls_transformer_lm, --sample-break-mode eos: one sentence per row), then
  fairseq-eval-lm's loss of both checkpoints;
* a RoBERTa sentence_prediction fine-tune (fairseq's own criterion) on support.roberta's corpus.

Tiny models, CPU. Marked `e2e`."""
import os

import pytest

from support.cli import corpus_once, eval_lm, generate, lm_train_args, make_lm_data_bin, train_args
from support.inprocess import train_losses
from support.roberta import roberta_corpus_once, sentence_prediction_argv

pytestmark = pytest.mark.e2e

UPDATES = 30
QUIET = ["--disable-validation", "--no-epoch-checkpoints", "--save-interval", "1000"]
DROPOUT = ["--dropout", "0.1", "--attention-dropout", "0.1"]
# fp32 on both sides: the packed path sums in other orders (per sentence, not per padded row)
RTOL = 1e-5


def both(tmp_path_factory, name, argv_of):
    """{packed: (losses, save_dir)} for --ls-packed False and True of argv_of(save_dir); checks that the packed
    attention ran in the packed run only (the run is in this process)."""
    from fairseq_lightseq.modules.transformer_layer import TransformerLayerBase

    out = {}
    original = TransformerLayerBase._attention_packed
    for packed in (False, True):
        calls = []
        TransformerLayerBase._attention_packed = lambda self, *a, **k: calls.append(1) or original(self, *a, **k)
        try:
            save_dir = str(tmp_path_factory.mktemp(f"{name}_{packed}"))
            out[packed] = train_losses([*argv_of(save_dir), "--ls-packed", str(packed)], save_dir), save_dir
        finally:
            TransformerLayerBase._attention_packed = original
        assert bool(calls) == packed
    return out


def assert_same_losses(runs):
    (padded, _), (packed, _) = runs[False], runs[True]
    assert len(padded) == len(packed) == UPDATES
    rel = max(abs(a - b) / abs(b) for a, b in zip(packed, padded))
    print(f"{UPDATES} updates, dropout on: max relative |packed - padded| loss {rel:.2e}; "
          f"last {packed[-1]:.6f} vs {padded[-1]:.6f}")
    assert rel < RTOL


def hypotheses(out: str):
    """{sentence id: (hypothesis, score)} of fairseq-generate's H- lines."""
    lines = [line.split("\t") for line in out.splitlines() if line.startswith("H-")]
    return {h[0]: (h[2], float(h[1])) for h in lines}


def test_translation_packed_trains_and_decodes_as_padded(tmp_path_factory):
    d = corpus_once(tmp_path_factory)
    runs = both(tmp_path_factory, "translation",
                lambda save: [*train_args(os.path.join(d, "bin"), save, UPDATES), *QUIET, *DROPOUT])
    assert_same_losses(runs)
    # each checkpoint continues the other way: 5 more updates of the packed run padded and vice versa
    more = {p: train_losses([*train_args(os.path.join(d, "bin"), runs[p][1], UPDATES + 5), *QUIET, *DROPOUT,
                             "--ls-packed", str(not p)], runs[p][1]) for p in (False, True)}
    assert len(more[False]) == len(more[True]) == 5
    assert max(abs(a - b) / abs(b) for a, b in zip(more[True], more[False])) < RTOL
    hyps = [hypotheses(generate(d, os.path.join(runs[p][1], "checkpoint_last.pt"), "--beam", "2")[1])
            for p in (False, True)]
    assert hyps[0] and hyps[0].keys() == hyps[1].keys()
    for key, (text, score) in hyps[0].items():  # the same words, the scores up to fp32 rounding
        assert hyps[1][key][0] == text and abs(hyps[1][key][1] - score) < 1e-4, key


def test_language_model_packed_trains_as_padded(tmp_path_factory):
    data_bin = make_lm_data_bin(str(tmp_path_factory.mktemp("lm_data")))
    runs = both(tmp_path_factory, "lm", lambda save: [*lm_train_args(data_bin, save, UPDATES, tokens_per_sample=32,
                                                                     break_mode="eos"), *QUIET, *DROPOUT])
    assert_same_losses(runs)
    loss = [eval_lm(data_bin, os.path.join(runs[p][1], "checkpoint_last.pt"), runs[p][1], "--sample-break-mode",
                    "eos")[0] for p in (False, True)]
    assert loss[0] > 1 and abs(loss[0] - loss[1]) < RTOL * loss[0]


def test_sentence_prediction_packed_trains_as_padded(tmp_path_factory):
    d = roberta_corpus_once(tmp_path_factory)
    argv = sentence_prediction_argv(d, UPDATES, *QUIET, *DROPOUT)
    assert_same_losses(both(tmp_path_factory, "sp", lambda save: [*argv, "--save-dir", save]))
