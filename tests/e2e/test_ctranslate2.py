"""Deploying with CTranslate2: `python -m fairseq_lightseq.export_ctranslate2` on a tiny ls_transformer, and
a tiny ls_bart_base fine-tuned by the translation task, trained through fairseq-train, then CTranslate2's
beam search against fairseq-generate's on the same test split (tokens in, tokens out), and the command's
refusals. Marked `e2e`; skipped, with one reason, where the ctranslate2 package is not installed (`make setup`
installs it when pip can)."""
import argparse
import math
import os
import re
import subprocess
import sys

import pytest
import torch

from support import ROOT, inprocess
from support.cli import env, generate, make_corpus, make_data_bin, make_lm_data_bin, run, train_args

ctranslate2 = pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed (pip install ctranslate2)")

from fairseq_lightseq import export_ctranslate2  # noqa: E402

pytestmark = pytest.mark.e2e

BEAM = 5
MAX_LEN = 200  # fairseq-generate's default --max-len-b (with --max-len-a 0)


def train_and_export(tmp_path_factory, *extra):
    """A tiny ls_transformer (or what `extra` changes) trained 120 updates at lr 0.01 (target = the source in
    upper case; about a third of the test sentences right, the others near misses: varied hypotheses),
    exported by the documented command; returns its folder."""
    d = str(tmp_path_factory.mktemp("ct2"))
    make_data_bin(d, n_train=300, n_valid=20, n_test=40)
    run(["fairseq-train", *train_args("bin", "ckpt", 120), "--lr", "0.01", "--no-epoch-checkpoints",
         "--disable-validation", *extra], d)
    rc, out = inprocess.call([sys.executable, "-m", "fairseq_lightseq.export_ctranslate2",
                              os.path.join(d, "ckpt", "checkpoint_last.pt"), os.path.join(d, "bin"),
                              os.path.join(d, "ct2")], ROOT)
    assert rc == 0 and "wrote" in out, out[-4000:]
    return d


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    return train_and_export(tmp_path_factory)


@pytest.fixture(scope="module")
def exported_bart(tmp_path_factory):
    """The same with ls_bart_base fine-tuned by fairseq's translation task (BART's learned positions,
    embedding layer norm, GELU)."""
    return train_and_export(tmp_path_factory, "--arch", "ls_bart_base", "--dropout", "0")


def fairseq_generate(d):
    """{id: (hypothesis tokens, per-token log-probs in nats incl. </s>)} of fairseq-generate on the ls checkpoint."""
    _, out, hyps = generate(d, "ckpt/checkpoint_last.pt", "--beam", str(BEAM), "--max-len-b", str(MAX_LEN),
                            "--required-batch-size-multiple", "1")
    positional = {int(m.group(1)): [float(x) * math.log(2) for x in m.group(2).split()]  # printed in base 2
                  for m in re.finditer(r"^P-(\d+)\t(.*)$", out, re.M)}
    return {i: (hyp.split(), positional[i]) for i, (_, hyp) in hyps.items()}


@pytest.mark.parametrize("model", ["exported", "exported_bart"])
def test_ctranslate2_gives_fairseq_generate_hypotheses(request, model):
    d = request.getfixturevalue(model)
    with open(os.path.join(d, "test.src")) as f:
        sources = [line.split() for line in f]
    ours = fairseq_generate(d)
    assert sorted(ours) == list(range(len(sources)))
    translator = ctranslate2.Translator(os.path.join(d, "ct2"), device="cpu", intra_threads=1)
    results = translator.translate_batch(sources, beam_size=BEAM, max_decoding_length=MAX_LEN)
    theirs = [r.hypotheses[0] for r in results]
    # At the length cap the two differ by design: fairseq forces </s> at step MAX_LEN and ranks with its
    # log-prob, CTranslate2 stops without it (a less trained model loops on some sentences).
    capped = [i for i in range(len(sources)) if max(len(theirs[i]), len(ours[i][0])) >= MAX_LEN]
    same = [i for i in range(len(sources)) if theirs[i] == ours[i][0]]
    with open(os.path.join(d, "test.tgt")) as f:
        right = sum(line.split() == ours[i][0] for i, line in enumerate(f))
    print(f"CTranslate2 beam {BEAM}: {len(same)} of {len(sources)} hypotheses identical to fairseq-generate's "
          f"({right} of them the reference); {len(capped)} at the {MAX_LEN}-token cap: {sorted(capped)}")
    # The same model: CTranslate2's log-probabilities of fairseq's hypotheses are fairseq's to the printed
    # precision (4 decimals, base 2), on every sentence.
    scored = translator.score_batch(sources, [ours[i][0] for i in range(len(sources))])
    worst = max(abs(a - b) for i, s in enumerate(scored) for a, b in zip(s.log_probs, ours[i][1], strict=True))
    print(f"largest per-token log-prob difference {worst:.2e}")
    assert worst < 1e-3
    # and the same beam search: every hypothesis that ended with </s> before the cap is fairseq's.
    assert set(range(len(sources))) - set(capped) <= set(same)
    assert len(capped) <= len(sources) // 4  # mostly finished hypotheses, or the check above is weak


def test_force_replaces_the_directory_with_int8_weights(exported, capsys):
    d = exported
    out = os.path.join(d, "ct2_int8")
    os.makedirs(out)
    args = [os.path.join(d, "ckpt", "checkpoint_last.pt"), os.path.join(d, "bin"), out]
    with pytest.raises(SystemExit) as e:
        export_ctranslate2.main(args)
    assert e.value.code == 1 and "already exists (--force replaces it)" in capsys.readouterr().err
    export_ctranslate2.main(args + ["--force", "--quantization", "int8"])
    translator = ctranslate2.Translator(out, device="cpu", intra_threads=1)
    assert translator.translate_batch([["w1", "w2", "w3"]], beam_size=2)[0].hypotheses[0]


def roberta_state(path):
    """A RoBERTa checkpoint as ls_roberta records it (a legacy Namespace); the refusal reads only the arch."""
    torch.save({"args": None, "cfg": {"model": argparse.Namespace(_name="ls_roberta", arch="ls_roberta")},
                "model": {}}, path)
    return path


@pytest.mark.parametrize("case", ["no_checkpoint", "no_data_bin", "roberta", "quantization", "one_language"])
def test_refusals_name_the_reason(exported, tmp_path, capsys, case):
    d = exported
    ckpt, data_bin, out, extra = os.path.join(d, "ckpt", "checkpoint_last.pt"), os.path.join(d, "bin"), \
        str(tmp_path / "out"), []
    expected = {"no_checkpoint": "is not a file", "no_data_bin": "is not a directory",
                "roberta": "only translation and language models", "quantization": "is not one of CTranslate2's",
                "one_language": "--source-lang alone: pass both --source-lang and --target-lang"}[case]
    if case == "no_checkpoint":
        ckpt = str(tmp_path / "missing.pt")
    elif case == "no_data_bin":
        data_bin = str(tmp_path / "missing_bin")
    elif case == "roberta":
        ckpt = roberta_state(str(tmp_path / "roberta.pt"))
    elif case == "quantization":
        extra = ["--quantization", "int3"]
    else:
        extra = ["--source-lang", "src"]
    with pytest.raises(SystemExit) as e:
        export_ctranslate2.main([ckpt, data_bin, out, *extra])
    err = capsys.readouterr().err
    assert e.value.code == 1 and expected in err, err
    assert not os.path.exists(out)


@pytest.mark.parametrize("task,reason", [("translation_from_pretrained_bart", "language token"),
                                         ("multilingual_denoising", "no translation model"),
                                         ("sentence_prediction", "a classifier")])
def test_bart_of_another_task_than_translation_is_refused(exported, tmp_path, capsys, task, reason):
    """An ls_mbart_base checkpoint as fairseq records a legacy task (cfg.task a Namespace); the refusal reads
    the arch and the task only."""
    ckpt, out = str(tmp_path / "mbart.pt"), str(tmp_path / "out")
    torch.save({"args": None, "cfg": {"model": argparse.Namespace(_name="ls_mbart_base", arch="ls_mbart_base"),
                                      "task": argparse.Namespace(_name=task, task=task)}, "model": {}}, ckpt)
    with pytest.raises(SystemExit) as e:
        export_ctranslate2.main([ckpt, os.path.join(exported, "bin"), out])
    err = capsys.readouterr().err
    assert e.value.code == 1 and f"'ls_mbart_base' was trained with --task {task}" in err and reason in err, err
    assert not os.path.exists(out)


@pytest.mark.parametrize("key,value,option", [
    ("cross_self_attention", True, "--cross-self-attention"),
    ("no_cross_attention", True, "--no-cross-attention"),
    ("encoder_layers_to_keep", "0", "--encoder-layers-to-keep"),
    ("adaptive_softmax_cutoff", "10", "--adaptive-softmax-cutoff"),
])
def test_options_ctranslate2_cannot_represent_are_refused(exported, tmp_path, capsys, key, value, option):
    """The trained checkpoint with one option set in its model config (a Namespace; the refusal reads only
    the config): the converter would drop the option or fail on a module the model does not have."""
    d = exported
    state = torch.load(os.path.join(d, "ckpt", "checkpoint_last.pt"), weights_only=False)
    setattr(state["cfg"]["model"], key, value)
    ckpt, out = str(tmp_path / "changed.pt"), str(tmp_path / "out")
    torch.save(state, ckpt)
    with pytest.raises(SystemExit) as e:
        export_ctranslate2.main([ckpt, os.path.join(d, "bin"), out])
    err = capsys.readouterr().err
    assert e.value.code == 1 and f"CTranslate2 cannot represent {option} " in err and err.count("\n") == 1, err
    assert not os.path.exists(out)


@pytest.fixture(scope="module")
def other_data_bins(tmp_path_factory):
    """{name: data-bin} that the exported model was not trained on: a translation data-bin over another
    vocabulary (the three-word corpus: 8 entries per dictionary, the model's have 40), and a language
    model's (dict.txt only)."""
    return {"other_vocabulary": os.path.join(make_corpus(str(tmp_path_factory.mktemp("ct2_corpus"))), "bin"),
            "language_model": make_lm_data_bin(str(tmp_path_factory.mktemp("ct2_lm_bin")))}


@pytest.mark.parametrize("case", ["other_vocabulary", "swapped", "language_model"])
def test_data_bin_mismatches_end_in_one_line(exported, other_data_bins, tmp_path, case):
    """Through the command as a user runs it: exit status 1 and one line (no traceback) naming what does
    not match and what to pass."""
    d = exported
    data_bin, extra = os.path.join(d, "bin"), []
    if case == "swapped":
        extra = ["--source-lang", "tgt", "--target-lang", "src"]
        expected = ("--source-lang tgt --target-lang src is the reverse of the model's direction src->tgt (the only "
                    f"pair {data_bin}'s files are named by); pass --source-lang src --target-lang tgt, or neither")
    else:
        data_bin = other_data_bins[case]
        expected = {"other_vocabulary": f"{data_bin}'s dictionaries do not match the checkpoint: dict.src.txt has 8 "
                                        "entries and dict.tgt.txt 8, the checkpoint's source vocabulary 40 and "
                                        "target vocabulary 40; pass the data-bin the model was trained on",
                    "language_model": f"{data_bin} is not a translation data-bin: no file is named like "
                                      "train.SRC-TGT.SRC.idx to give the language pair, and the checkpoint records "
                                      "none (dictionaries found: dict.txt, a language model's data-bin); pass the "
                                      "data-bin the model was trained on, or --source-lang and --target-lang"}[case]
    out = str(tmp_path / "out")
    r = subprocess.run([sys.executable, "-m", "fairseq_lightseq.export_ctranslate2",
                        os.path.join(d, "ckpt", "checkpoint_last.pt"), data_bin, out, *extra],
                       cwd=ROOT, capture_output=True, text=True, timeout=300, env=env())
    errors = [line for line in r.stderr.splitlines() if not line.startswith("INFO:")]  # fairseq's logging
    assert r.returncode == 1 and len(errors) == 1, r.stderr[-4000:]
    assert errors[0].startswith("python -m fairseq_lightseq.export_ctranslate2: error: ") and expected in errors[0]
    assert not os.path.exists(out)
