"""fp16 on the CPU through the command line: `fairseq-train --memory-efficient-fp16 --cpu` and plain
`--fp16 --cpu` with the ls model, criterion and optimizer log the losses of fairseq's
transformer/criterion/adam within fp16 noise, and `fairseq-generate --cpu --fp16` decodes its
checkpoint as fp32 decoding does (the CPU fp16 tensors go through the reference ops).

Plain `--fp16` on a CPU runs because the plugin turns on `--fp16-no-flatten-grads` there
(fairseq_lightseq/patches/cli_config.py: fairseq's flat fp32 copy needs CUDA and stops before the first
update with "Torch not compiled with CUDA enabled"), for fairseq's model too.

`--fp16-init-scale 4`: on this 3-word corpus the embedding gradients overflow fp16 at fairseq's
initial loss scale 128, and fairseq's trainer then fails on a CPU (its overflow handler calls
`torch.tensor(0.).cuda()`), native and ls alike; a test pins that, as the README's known limits say."""
import pytest

from support.cli import LS, NATIVE, corpus_once, generate, per_update, train

pytestmark = pytest.mark.e2e

RUN = ["--dropout", "0", "--lr", "5e-3", "--max-tokens", "2000", "--max-update", "4", "--seed", "3",
       "--disable-validation", "--log-format", "json", "--log-interval", "1", "--no-epoch-checkpoints"]
FP16 = ["--memory-efficient-fp16", "--fp16-init-scale", "4", *RUN]
PLAIN_FP16 = ["--fp16", "--fp16-init-scale", "4", *RUN]
SHORT = ["--max-len-a", "0", "--max-len-b", "12"]
UNFLATTENED = "fairseq_lightseq: --fp16 on CPU: fp32 master weights per parameter (--fp16-no-flatten-grads)"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    d = corpus_once(tmp_path_factory)
    _, ls_log = train(d, *LS, *FP16, "--save-dir", "fp16_ls")
    _, native_log = train(d, *NATIVE, *FP16, "--save-dir", "fp16_native")
    return d, ls_log, native_log


def _assert_matches_native(ls_log, native_log):
    ours, ref = per_update(ls_log), per_update(native_log)
    print("per-update loss, ls vs native (fp16, CPU):", [(a[1], b[1]) for a, b in zip(ours, ref)])
    assert [u for u, *_ in ours] == [1, 2, 3, 4] == [u for u, *_ in ref]
    for (u, loss, nll, lr), (_, loss_ref, nll_ref, lr_ref) in zip(ours, ref):
        assert lr == lr_ref
        assert abs(loss - loss_ref) <= 0.01 * loss_ref, (u, loss, loss_ref)
        assert abs(nll - nll_ref) <= 0.01 * nll_ref, (u, nll, nll_ref)


def test_memory_efficient_fp16_training_matches_native(trained):
    _, ls_log, native_log = trained
    _assert_matches_native(ls_log, native_log)
    assert UNFLATTENED not in ls_log  # no fp32 master copy to lay out


def test_plain_fp16_trains_on_cpu_and_matches_native(trained):
    """Without the plugin's correction both runs stop before the first update (fairseq's
    fp16_optimizer.py: torch.cuda.current_device())."""
    d = trained[0]
    _, ls_log = train(d, *LS, *PLAIN_FP16, "--save-dir", "plain_fp16_ls")
    _, native_log = train(d, *NATIVE, *PLAIN_FP16, "--save-dir", "plain_fp16_native")
    assert UNFLATTENED in ls_log and UNFLATTENED in native_log
    assert '"loss_scale": "4"' in ls_log  # fairseq's FP16Optimizer with its dynamic loss scaler
    _assert_matches_native(ls_log, native_log)


@pytest.mark.parametrize("stack", [LS, NATIVE], ids=["ls", "native"])
def test_fp16_overflow_stops_fairseqs_trainer_on_cpu(trained, stack):
    """fairseq's limit, not ours: at the default initial loss scale (128) this corpus overflows within
    two updates and the trainer's overflow handler calls .cuda() (fairseq/trainer.py), for --fp16
    and --memory-efficient-fp16, ls and native alike. The README's known limits say so; should the
    run succeed one day, fairseq has fixed it and the README should say that instead."""
    d = trained[0]
    rc, log = train(d, *stack, "--fp16", *RUN, "--save-dir", f"overflow_{stack[1]}", check=False)
    assert rc != 0
    assert "NOTE: gradient overflow detected" in log
    assert "grad_norm = torch.tensor(0.0).cuda()" in log and "Torch not compiled with CUDA enabled" in log


def test_fp16_generate_on_cpu_matches_fp32(trained):
    d = trained[0]
    _, _, fp32 = generate(d, "fp16_ls/checkpoint_last.pt", *SHORT)
    _, _, fp16 = generate(d, "fp16_ls/checkpoint_last.pt", "--fp16", *SHORT)
    assert sorted(fp16) == sorted(fp32) and len(fp32) == 40
    same = [i for i in fp32 if fp16[i][1] == fp32[i][1]]
    worst = max(abs(fp16[i][0] - fp32[i][0]) for i in same)
    print(f"fp16 vs fp32 decoding: {len(same)} of {len(fp32)} hypotheses agree, max score difference {worst:.2e}")
    assert len(same) >= 0.8 * len(fp32)
    assert worst < 0.01
