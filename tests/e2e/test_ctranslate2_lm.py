"""Serving a language model with CTranslate2: `python -m fairseq_lightseq.export_ctranslate2` on a tiny
ls_transformer_lm (post-norm, sinusoidal positions, relu, 512-wide input and output projections) and on
fairseq's own transformer_lm_gpt2_tiny (pre-norm, learned positions, gelu), each trained 40 updates through
fairseq-train on counting sentences (w5 w6 ... w11: a random first word, then its successors up to w11, so
that greedy continuations of different lengths end in </s>); CTranslate2's Generator against the hub's
greedy `sample` and against fairseq-eval-lm's per-token log-probabilities on the test split; the refusals.
Marked `e2e`; skipped, with one reason, where the ctranslate2 package is not installed."""
import argparse
import os
import re
import sys

import pytest
import torch

from support import ROOT, inprocess
from support.cli import USER_DIR, make_lm_data_bin, run

ctranslate2 = pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed (pip install ctranslate2)")

from fairseq.data import Dictionary  # noqa: E402

from fairseq_lightseq import export_ctranslate2  # noqa: E402

pytestmark = pytest.mark.e2e

TOKENS_PER_SAMPLE = 32  # the models' max positions
COMMON = ["--task", "language_modeling", "--decoder-layers", "1", "--decoder-embed-dim", "32",
          "--decoder-ffn-embed-dim", "64", "--decoder-attention-heads", "2", "--share-decoder-input-output-embed",
          "--tokens-per-sample", str(TOKENS_PER_SAMPLE), "--sample-break-mode", "none", "--dropout", "0.0",
          "--lr", "0.01", "--max-tokens", "256", "--max-update", "40", "--seed", "1", "--cpu", "--num-workers", "0",
          "--no-epoch-checkpoints", "--disable-validation"]
STACKS = {
    "ls": ["--user-dir", USER_DIR, "--arch", "ls_transformer_lm", "--criterion", "ls_cross_entropy",
           "--optimizer", "ls_adam"],
    "native": ["--arch", "transformer_lm_gpt2_tiny", "--decoder-normalize-before", "--decoder-learned-pos",
               "--criterion", "cross_entropy", "--optimizer", "adam"],
}


WORDS = 12


def counting(rng):
    return " ".join(f"w{i}" for i in range(rng.randrange(WORDS), WORDS))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("ct2_lm"))
    make_lm_data_bin(d, sentence=counting)
    return d


@pytest.fixture(scope="module", params=sorted(STACKS))
def exported(request, data):
    """(corpus directory, model name): the model trained into d/NAME, exported by the documented command
    to d/ct2_NAME."""
    d, name = data, request.param
    run(["fairseq-train", "bin", *STACKS[name], *COMMON, "--save-dir", name], d)
    rc, out = inprocess.call([sys.executable, "-m", "fairseq_lightseq.export_ctranslate2",
                              os.path.join(d, name, "checkpoint_last.pt"), os.path.join(d, "bin"),
                              os.path.join(d, f"ct2_{name}")], ROOT)
    assert rc == 0 and "wrote" in out, out[-4000:]
    return d, name


def generator(d, name):
    return ctranslate2.Generator(os.path.join(d, f"ct2_{name}"), device="cpu", intra_threads=1)


def test_the_exported_model_starts_with_fairseqs_start_token(exported):
    d, name = exported
    with open(os.path.join(d, f"ct2_{name}", "config.json")) as f:
        config = f.read()
    # fairseq's start token of a language model without --add-bos-token is </s>
    assert '"bos_token": "</s>"' in config and '"eos_token": "</s>"' in config


@pytest.mark.parametrize("max_len_b", [None, 4], ids=["to_eos", "capped"])
def test_generator_greedy_equals_the_hub_greedy_sample(exported, max_len_b):
    """Prompts: the first word or two of each test sentence. fairseq caps a hypothesis at max_len_b tokens
    (the prompt included; at most the model's positions - 1), then appends </s>; CTranslate2's max_length
    counts the same tokens after its start token, and stops without </s>."""
    from fairseq.models.transformer_lm import TransformerLanguageModel

    d, name = exported
    with open(os.path.join(d, "test.txt")) as f:
        prompts = [" ".join(line.split()[:1 + i % 2]) for i, line in enumerate(f)]
    hub = TransformerLanguageModel.from_pretrained(os.path.join(d, name), "checkpoint_last.pt",
                                                   os.path.join(d, "bin")).eval()
    cap = min(max_len_b or 200, hub.models[0].max_decoder_positions() - 1)  # 200: fairseq's default max_len_b
    greedy = dict(beam=1, sampling=False) if max_len_b is None else dict(beam=1, sampling=False, max_len_b=max_len_b)
    ours = hub.sample(prompts, **greedy)
    results = generator(d, name).generate_batch([["</s>"] + p.split() for p in prompts], beam_size=1,
                                                max_length=cap)
    theirs = [" ".join(r.sequences[0]) for r in results]
    same = sum(a == b for a, b in zip(ours, theirs))
    capped = sum(len(h.split()) == cap for h in ours)
    longer = sum(len(h.split()) > len(p.split()) for h, p in zip(ours, prompts))
    print(f"{name}, cap {cap}: {same} of {len(prompts)} greedy continuations identical to the hub's sample "
          f"({capped} at the cap, {longer} longer than the prompt)")
    assert ours == theirs
    # the model continues prompts (to the cap where there is one), or the check is weak
    assert (longer if max_len_b is None else capped) >= len(prompts) // 4


def eval_lm_word_scores(d, name):
    """{sentence id: [(token, log-prob in nats)]} printed by fairseq-eval-lm --output-word-probs on the test
    split, one sentence per sample (--sample-break-mode eos), </s> last."""
    _, out = run(["fairseq-eval-lm", "bin", "--path", os.path.join(name, "checkpoint_last.pt"), "--user-dir",
                  USER_DIR, "--gen-subset", "test", "--sample-break-mode", "eos", "--tokens-per-sample",
                  str(TOKENS_PER_SAMPLE), "--batch-size", "8", "--output-word-probs", "--cpu", "--num-workers",
                  "0"], d)
    scores = {}
    for m in re.finditer(r"fairseq_cli\.eval_lm(?: \| |:)(\d+) (.*)$", out, re.M):  # either logging format
        words = [re.fullmatch(r"(\S+) \[(\S+)\]", w) for w in m.group(2).split("\t")]
        scores[int(m.group(1))] = [(w.group(1), float(w.group(2))) for w in words]
    return scores


def test_generator_scores_equal_eval_lm(exported):
    """CTranslate2's score_batch on "</s> w1 .. wn </s>" gives one log-prob per token after the start token,
    as fairseq-eval-lm does per sentence (printed to 6 decimals)."""
    d, name = exported
    with open(os.path.join(d, "test.txt")) as f:
        sentences = [line.split() for line in f]
    ours = eval_lm_word_scores(d, name)
    assert sorted(ours) == list(range(len(sentences)))
    assert all([w for w, _ in ours[i]] == s + ["</s>"] for i, s in enumerate(sentences))
    scored = generator(d, name).score_batch([["</s>"] + s + ["</s>"] for s in sentences])
    worst = max(abs(a - b) for i, r in enumerate(scored)
                for a, (_, b) in zip(r.log_probs, ours[i], strict=True))
    tokens = sum(len(s) + 1 for s in sentences)
    print(f"{name}: largest per-token log-prob difference {worst:.2e} over {tokens} tokens")
    assert worst < 1e-4


def test_a_legacy_checkpoint_exports_the_same_model(exported, tmp_path):
    """fairseq before 0.10 saved a language model's options as one Namespace, `args`, and no cfg: the
    converter's own format, passed on as it is."""
    d, name = exported
    ckpt = os.path.join(d, name, "checkpoint_last.pt")
    _, native = export_ctranslate2.native_state(torch.load(ckpt, weights_only=False))
    args = native["args"]
    if name == "ls":  # as ours recorded it, converted by the export
        args = argparse.Namespace(**dict(vars(args), arch="ls_" + args.arch))
    legacy = str(tmp_path / "legacy.pt")
    torch.save({"args": args, "model": native["model"]}, legacy)
    export_ctranslate2.main([legacy, os.path.join(d, "bin"), str(tmp_path / "out")])
    for f in ("model.bin", "config.json", "vocabulary.json"):
        with open(tmp_path / "out" / f, "rb") as a, open(os.path.join(d, f"ct2_{name}", f), "rb") as b:
            assert a.read() == b.read(), f


def _set_option(state, section, key, value):
    """cfg[section].key = value in a loaded checkpoint (the model config is a Namespace in ours, a dict in
    fairseq's transformer_lm; the task config a dict)."""
    cfg = state["cfg"][section]
    if isinstance(cfg, dict):
        cfg[key] = value
    else:
        setattr(cfg, key, value)


@pytest.mark.parametrize("section,key,value,expected", [
    ("model", "adaptive_softmax_cutoff", "5,10", "CTranslate2 cannot represent --adaptive-softmax-cutoff"),
    ("model", "scale_fc", True, "CTranslate2 cannot represent --scale-fc"),
    ("model", "base_layers", 1, "CTranslate2 cannot represent --base-layers"),
    ("model", "decoder_layers_to_keep", "0", "CTranslate2 cannot represent --decoder-layers-to-keep"),
    ("model", "decoder_output_dim", 48, "CTranslate2 cannot represent --decoder-input-dim/--decoder-output-dim"),
    ("task", "output_dictionary_size", 10, "CTranslate2 cannot represent --output-dictionary-size"),
    # the converter's own refusal, as one line
    ("model", "activation_fn", "tanh",
     "CTranslate2 cannot represent this model: Option --activation-fn tanh is not supported"),
])
def test_options_ctranslate2_cannot_represent_are_refused(exported, tmp_path, capsys, section, key, value,
                                                          expected):
    """The trained checkpoint with one option changed in its config (the refusal reads only the config)."""
    d, name = exported
    state = torch.load(os.path.join(d, name, "checkpoint_last.pt"), weights_only=False)
    if key == "decoder_output_dim" and name == "ls":  # ours projects both sides (512-wide); keep the input's
        _set_option(state, section, "decoder_input_dim", 32)
    _set_option(state, section, key, value)
    ckpt, out = str(tmp_path / "changed.pt"), str(tmp_path / "out")
    torch.save(state, ckpt)
    with pytest.raises(SystemExit) as e:
        export_ctranslate2.main([ckpt, os.path.join(d, "bin"), out])
    err = capsys.readouterr().err
    assert e.value.code == 1 and expected in err, err
    assert err.count("\n") == 1 and not os.path.exists(out)


def _dictionary_dir(path, names, words):
    """A directory holding fairseq dictionaries `names` (dict.txt, dict.src.txt, ...) of `words`."""
    os.makedirs(path)
    dictionary = Dictionary()
    for w in words:
        dictionary.add_symbol(w)
    for n in names:
        dictionary.save(os.path.join(path, n))
    return str(path)


@pytest.mark.parametrize("case", ["translation_data_bin", "other_dictionary", "languages"])
def test_data_bin_mismatches_are_refused(exported, tmp_path, capsys, case):
    d, name = exported
    data_bin, extra = os.path.join(d, "bin"), []
    if case == "translation_data_bin":
        data_bin = _dictionary_dir(tmp_path / "tr", ["dict.src.txt", "dict.tgt.txt"], ["a", "b"])
        expected = "has no dict.txt, the dictionary of a language model's data-bin"
    elif case == "other_dictionary":
        data_bin = _dictionary_dir(tmp_path / "lm", ["dict.txt"], ["a", "b"])
        size = len(Dictionary.load(os.path.join(d, "bin", "dict.txt")))
        expected = f"dict.txt has 6 entries, the checkpoint's vocabulary {size}"
    else:
        extra = ["--source-lang", "src", "--target-lang", "tgt"]
        expected = "--source-lang/--target-lang are for translation models"
    out = str(tmp_path / "out")
    with pytest.raises(SystemExit) as e:
        export_ctranslate2.main([os.path.join(d, name, "checkpoint_last.pt"), data_bin, out, *extra])
    err = capsys.readouterr().err
    assert e.value.code == 1 and expected in err, err
    assert not os.path.exists(out)
