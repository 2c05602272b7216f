"""fp16 on the CPU through the command line: `fairseq-train --memory-efficient-fp16 --cpu` with the ls
model, criterion and optimizer logs the losses of fairseq's transformer/criterion/adam within fp16
noise, and `fairseq-generate --cpu --fp16` decodes its checkpoint as fp32 decoding does (the CPU
fp16 tensors go through the reference ops).

`--fp16-init-scale 4`: on this 3-word corpus the embedding gradients overflow fp16 at fairseq's
initial loss scale 128, and fairseq's trainer then fails on a CPU (its overflow handler calls
`torch.tensor(0.).cuda()`), native and ls alike."""
import pytest

from support.cli import LS, NATIVE, corpus_once, generate, per_update, train

pytestmark = pytest.mark.e2e

FP16 = ["--memory-efficient-fp16", "--fp16-init-scale", "4", "--dropout", "0", "--lr", "5e-3", "--max-tokens", "2000",
        "--max-update", "4", "--seed", "3", "--disable-validation", "--log-format", "json", "--log-interval", "1",
        "--no-epoch-checkpoints"]
SHORT = ["--max-len-a", "0", "--max-len-b", "12"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    d = corpus_once(tmp_path_factory)
    _, ls_log = train(d, *LS, *FP16, "--save-dir", "fp16_ls")
    _, native_log = train(d, *NATIVE, *FP16, "--save-dir", "fp16_native")
    return d, ls_log, native_log


def test_memory_efficient_fp16_training_matches_native(trained):
    _, ls_log, native_log = trained
    ours, ref = per_update(ls_log), per_update(native_log)
    print("per-update loss, ls vs native (fp16, CPU):", [(a[1], b[1]) for a, b in zip(ours, ref)])
    assert [u for u, *_ in ours] == [1, 2, 3, 4] == [u for u, *_ in ref]
    for (u, loss, nll, lr), (_, loss_ref, nll_ref, lr_ref) in zip(ours, ref):
        assert lr == lr_ref
        assert abs(loss - loss_ref) <= 0.01 * loss_ref, (u, loss, loss_ref)
        assert abs(nll - nll_ref) <= 0.01 * nll_ref, (u, nll, nll_ref)


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
