"""The language model through fairseq's own tools: fairseq-train with ls_transformer_lm +
ls_cross_entropy + ls_adam next to fairseq's transformer_lm + cross_entropy + adam, fairseq-eval-lm (with
and without --context-window; --bf16, which fairseq's eval-lm runs in float32) on our checkpoint and on it converted for a vanilla fairseq (no
--user-dir), the hub interface (from_pretrained, sample, score), and --restore-file across the two
implementations. Tiny models (1 layer, width 32), CPU. Marked `e2e`."""
import json
import os
import re

import pytest
import torch

from support.cli import USER_DIR, convert, make_lm_data_bin, run

pytestmark = pytest.mark.e2e

MODEL = ["--decoder-layers", "1", "--decoder-embed-dim", "32", "--decoder-ffn-embed-dim", "64",
         "--decoder-attention-heads", "2", "--share-decoder-input-output-embed"]
LS = ["--user-dir", USER_DIR, "--arch", "ls_transformer_lm_gpt2_tiny", "--criterion", "ls_cross_entropy",
      "--optimizer", "ls_adam"]
NATIVE = ["--arch", "transformer_lm_gpt2_tiny", "--criterion", "cross_entropy", "--optimizer", "adam"]


def train_lm(d, stack, save_dir, updates, *extra):
    args = ["fairseq-train", "bin", "--task", "language_modeling", *stack, *MODEL, "--tokens-per-sample", "16",
            "--sample-break-mode", "none", "--dropout", "0.1", "--attention-dropout", "0.1", "--lr", "0.003",
            "--max-tokens", "128", "--max-update", str(updates), "--seed", "1", "--cpu", "--num-workers", "0",
            "--save-dir", save_dir, "--no-epoch-checkpoints", "--log-format", "json", "--log-interval", "1", *extra]
    return run(args, d)[1]


def train_losses(log):
    return {int(r["num_updates"]): float(r["loss"]) for r in
            (json.loads(line[line.index("{"):]) for line in log.splitlines() if "train_inner" in line and "{" in line)}


def eval_lm_log(d, path, *extra):
    """fairseq-eval-lm on the test split; returns ((base-2 loss, perplexity), its log)."""
    out = run(["fairseq-eval-lm", "bin", "--path", path, "--tokens-per-sample", "16", "--max-tokens", "256",
               "--cpu", "--num-workers", "0", "--gen-subset", "test", *extra], d)[1]
    m = re.search(r"Loss \(base 2\): ([\d.]+), Perplexity: ([\d.]+)", out)
    assert m, out[-3000:]
    return (float(m.group(1)), float(m.group(2))), out


def eval_lm(d, path, *extra):
    """fairseq-eval-lm on the test split; returns (base-2 loss, perplexity)."""
    return eval_lm_log(d, path, *extra)[0]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("lm"))
    make_lm_data_bin(d)
    log = train_lm(d, LS, "ls", 30)
    convert(os.path.join(d, "ls/checkpoint_last.pt"), os.path.join(d, "ls_as_native.pt"), "fairseq", d)
    return d, log


def test_training_lowers_the_loss_and_validates(trained):
    d, log = trained
    losses = train_losses(log)
    assert len(losses) == 30 and losses[30] < losses[1] - 1.0
    assert '"valid_ppl"' in log


@pytest.mark.parametrize("window", [None, "8"], ids=["blocks", "context_window"])
def test_eval_lm_on_ours_equals_vanilla_fairseq_on_the_converted_checkpoint(trained, window):
    """The converted checkpoint holds fairseq's transformer_lm config as fairseq records it, so it loads
    without the plugin (torch's safe loader, nothing allowlisted) and gives our perplexity."""
    d, _ = trained
    extra = ["--context-window", window] if window else []
    ours = eval_lm(d, "ls/checkpoint_last.pt", "--user-dir", USER_DIR, *extra)
    native = eval_lm(d, "ls_as_native.pt", *extra)
    assert ours == pytest.approx(native, abs=1e-4)
    cfg = torch.load(os.path.join(d, "ls_as_native.pt"))["cfg"]  # weights_only: plain containers
    assert cfg["model"]["_name"] == "transformer_lm_gpt2_tiny" and cfg["criterion"]["_name"] == "cross_entropy"


def test_eval_lm_bf16_runs_fp32_as_fairseq_and_says_so(trained):
    """fairseq's evaluation commands cast the model for --fp16 only: --bf16 gives the float32 perplexity, with
    fairseq's own model and without the plugin too; the plugin warns that it does (and does not claim to train)."""
    d, _ = trained
    fp32 = eval_lm(d, "ls/checkpoint_last.pt", "--user-dir", USER_DIR)
    ours, log = eval_lm_log(d, "ls/checkpoint_last.pt", "--user-dir", USER_DIR, "--bf16")
    native, native_log = eval_lm_log(d, "ls_as_native.pt", "--user-dir", USER_DIR, "--bf16")
    vanilla, vanilla_log = eval_lm_log(d, "ls_as_native.pt", "--bf16")
    print(f"eval-lm base-2 loss, perplexity: fp32 {fp32}; --bf16: ours {ours}, native {native}, "
          f"native without the plugin {vanilla}")
    assert ours == fp32 and native == pytest.approx(fp32, abs=1e-4) and vanilla == native
    warning = "fairseq_lightseq: --bf16: fairseq-eval-lm runs the model in float32, as fairseq does"
    assert warning in log and warning in native_log and "fairseq_lightseq" not in vanilla_log
    assert "training in bfloat16" not in log


def test_hub_sample_and_score_match_the_native_model(trained):
    from fairseq.models.transformer_lm import TransformerLanguageModel

    import fairseq_lightseq  # noqa: F401
    from fairseq_lightseq.models.ls_transformer_lm import LSTransformerLanguageModel

    d, _ = trained
    ours = LSTransformerLanguageModel.from_pretrained(os.path.join(d, "ls"), "checkpoint_last.pt",
                                                      os.path.join(d, "bin")).eval()
    native = TransformerLanguageModel.from_pretrained(d, "ls_as_native.pt", os.path.join(d, "bin")).eval()
    assert type(ours.models[0]) is LSTransformerLanguageModel and type(native.models[0]) is TransformerLanguageModel
    prompts = ["the cat", "a big red"]
    greedy = dict(beam=1, sampling=False, max_len_b=8)
    assert ours.sample(prompts, **greedy) == native.sample(prompts, **greedy)
    beam = dict(beam=3, max_len_b=6)
    assert ours.sample(prompts, **beam) == native.sample(prompts, **beam)
    a, b = ours.score("the dog sat on the mat"), native.score("the dog sat on the mat")
    assert torch.allclose(a["positional_scores"], b["positional_scores"], atol=1e-5)


def test_restore_file_continues_across_implementations(trained):
    """20 native updates, converted, continued to 30 by ls; and our 30-update checkpoint continued by fairseq:
    num_updates and the optimizer state carry over (no --reset-optimizer), the loss keeps its level."""
    d, ls_log = trained
    native_log = train_lm(d, NATIVE, "native", 20)
    convert(os.path.join(d, "native/checkpoint_last.pt"), os.path.join(d, "native_as_ls.pt"), "lightseq", d)
    cont = train_lm(d, LS, "cont_ls", 30, "--restore-file", os.path.join(d, "native_as_ls.pt"))
    losses = train_losses(cont)
    assert sorted(losses) == list(range(21, 31))
    assert abs(losses[21] - train_losses(native_log)[20]) < 0.5
    back = train_lm(d, NATIVE, "cont_native", 35, "--restore-file", os.path.join(d, "ls_as_native.pt"))
    losses = train_losses(back)
    assert sorted(losses) == list(range(31, 36))
    assert abs(losses[31] - train_losses(ls_log)[30]) < 0.5
