"""Training modes of ls_transformer: activation checkpointing (+ offload), bf16, fp16/AMP (CUDA),
gradient accumulation (--update-freq) and EMA (--store-ema). (bf16 and distributed training through
the command line: tests/e2e/test_bf16.py, tests/e2e/test_distributed.py.)

Module-level tests run in-process on tiny models. `e2e` tests drive fairseq's real command line
(`python -m fairseq_cli.train`, run in this process by support.cli.run) on a tiny data-bin made once
per session with fairseq-preprocess, with a 1-layer, 32-dim model on the CPU for 6 updates. `cuda`
tests need a GPU (skipped here).

The Trainer-level bf16 test builds fairseq's Trainer directly (as scripts/bench_support/sides.py does).
"""
import copy
import os
import random
import re
import sys

import pytest
import torch

from fairseq_lightseq.models.ls_transformer import LSTransformerModel
from support.cli import run
from support.models import batch, build, make_task, perturb_

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
USER_DIR = os.path.join(ROOT, "fairseq_lightseq")

DROPOUTS = dict(dropout=0.1, attention_dropout=0.1, activation_dropout=0.1)


# --------------------------------------------------------------- activation checkpointing (module)
def _pair_ckpt(device="cpu", offload=False):
    """(plain, checkpointed) ls_transformer with the same weights, train mode, dropout on.
    (fairseq's --offload-activations implies --checkpoint-activations.)"""
    task = make_task()
    torch.manual_seed(0)
    plain = perturb_(build(LSTransformerModel, task, **DROPOUTS))
    ckpt = build(LSTransformerModel, task, checkpoint_activations=True, offload_activations=offload, **DROPOUTS)
    ckpt.load_state_dict(plain.state_dict(), strict=True)
    return task, plain.to(device).train(), ckpt.to(device).train()


def _run(model, task, seed, device="cpu"):
    """Forward + backward under `seed`; consumes RNG between them (as other layers would), so the
    recomputation only matches if the checkpoint restored the forward's RNG state."""
    src, lengths, prev = (t.to(device) for t in batch(task, B=3, S=7, T=6))
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    out, _ = model(src, lengths, prev)
    torch.rand(100)
    if device == "cuda":
        torch.cuda.manual_seed(seed + 1)  # and the CUDA generator
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).to(out)
    (out * w).sum().backward()
    return out.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("offload", [False, True], ids=["checkpoint", "checkpoint+offload"])
def test_checkpoint_activations_same_gradients_with_dropout(device, offload):
    task, plain, ckpt = _pair_ckpt(device, offload)
    assert all(hasattr(layer, "precheckpoint_forward") for layer in [*ckpt.encoder.layers, *ckpt.decoder.layers])
    assert not any(hasattr(layer, "precheckpoint_forward") for layer in plain.encoder.layers)
    out_p, g_p = _run(plain, task, seed=3, device=device)
    out_c, g_c = _run(ckpt, task, seed=3, device=device)
    torch.testing.assert_close(out_c, out_p, rtol=0, atol=0)
    assert g_c.keys() == g_p.keys() and len(g_p) == len(list(plain.parameters()))
    for n in g_p:
        torch.testing.assert_close(g_c[n], g_p[n], rtol=1e-5, atol=1e-6, msg=n)
    # the dropout masks matter: another seed gives other gradients
    _, g_other = _run(plain, task, seed=4, device=device)
    assert any(not torch.allclose(g_other[n], g_p[n]) for n in g_p)


def test_checkpoint_activations_state_dict_eval_and_deepcopy():
    task, plain, ckpt = _pair_ckpt()
    assert list(ckpt.state_dict()) == list(plain.state_dict())  # checkpoints interchange
    src, lengths, prev = batch(task)
    plain.eval(), ckpt.eval()
    with torch.no_grad():
        torch.testing.assert_close(ckpt(src, lengths, prev)[0], plain(src, lengths, prev)[0], rtol=0, atol=0)
    # fairseq's EMA deep-copies the model: the copy's wrapped forward must use the copy's weights
    twin = copy.deepcopy(ckpt).train()
    with torch.no_grad():
        for p in twin.parameters():
            p.mul_(1.01)
    _, g = _run(twin, task, seed=5)
    assert all(p.grad is None for p in ckpt.parameters())
    assert len(g) == len(list(twin.parameters()))


# ---------------------------------------------------------------------------------- bf16 (module)
def test_bf16_model_forward_backward_finite_and_close_to_fp32():
    task = make_task()
    torch.manual_seed(0)
    m32 = perturb_(build(LSTransformerModel, task)).train()
    m16 = copy.deepcopy(m32).to(torch.bfloat16)
    src, lengths, prev = batch(task, B=4, S=9, T=7)
    outs, grads = [], []
    for m in (m32, m16):
        out, _ = m(src, lengths, prev)
        w = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out)
        (out.float() * w.float()).sum().backward()
        outs.append(out.float())
        grads.append(torch.cat([p.grad.float().flatten() for p in m.parameters()]))
    assert outs[1].dtype == torch.float32 and torch.isfinite(outs[1]).all() and torch.isfinite(grads[1]).all()
    assert all(p.grad.dtype == torch.bfloat16 for p in m16.parameters())
    rel = (outs[1] - outs[0]).abs().max() / outs[0].abs().max()
    assert rel < 3e-2, rel
    cos = torch.nn.functional.cosine_similarity(grads[0], grads[1], dim=0)
    assert cos > 0.99, cos


# ------------------------------------------------------------------------- fairseq CLI and Trainer
def _run_cli(args, cwd):
    """`python -m` args (a fairseq_cli module), in this process (support.cli.run); returns the log."""
    return run([sys.executable, "-m", *args], cwd)[1]


@pytest.fixture(scope="session")
def data_bin(tmp_path_factory):
    """A tiny joined-dictionary data-bin: the target is the source in upper case."""
    d = tmp_path_factory.mktemp("modes_data")
    rng = random.Random(0)
    words = [f"w{i}" for i in range(16)]
    for split, n in (("train", 200), ("valid", 16)):
        with open(d / f"{split}.src", "w") as fs, open(d / f"{split}.tgt", "w") as ft:
            for _ in range(n):
                s = rng.choices(words, k=rng.randint(3, 8))
                fs.write(" ".join(s) + "\n")
                ft.write(" ".join(w.upper() for w in s) + "\n")
    _run_cli(["fairseq_cli.preprocess", "--source-lang", "src", "--target-lang", "tgt", "--trainpref", "train",
              "--validpref", "valid", "--destdir", "bin", "--joined-dictionary", "--workers", "1"], d)
    return str(d / "bin")


def _train_args(data_bin, save_dir, dropout=0.1, cpu=True, updates=6):
    args = [data_bin, "--user-dir", USER_DIR, "--arch", "ls_transformer", "--encoder-layers", "1",
            "--decoder-layers", "1", "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
            "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2",
            "--decoder-attention-heads", "2", "--share-all-embeddings", "--dropout", str(dropout),
            "--optimizer", "ls_adam", "--lr", "0.005", "--criterion", "ls_label_smoothed_cross_entropy",
            "--label-smoothing", "0.1", "--max-tokens", "400", "--max-update", str(updates), "--seed", "1",
            "--num-workers", "0", "--save-dir", str(save_dir), "--no-epoch-checkpoints", "--disable-validation",
            "--log-format", "simple", "--log-interval", "1"]
    return args + (["--cpu"] if cpu else [])


def _losses(log):
    return [float(x) for x in re.findall(r"train_inner \|.*? loss=([\d.]+)", log)]


def train(data_bin, save_dir, *extra, dropout=0.1, cpu=True):
    """fairseq-train through its module entry point; returns the logged per-update losses."""
    log = _run_cli(["fairseq_cli.train", *_train_args(data_bin, save_dir, dropout, cpu), *extra], ROOT)
    losses = _losses(log)
    assert len(losses) == 6, log[-3000:]
    assert all(x == x and x < 100 for x in losses), losses
    return losses


def _decreases(losses):
    return sum(losses[-2:]) / 2 < sum(losses[:2]) / 2 - 0.5


@pytest.fixture(scope="module")
def baseline(data_bin, tmp_path_factory):
    return train(data_bin, tmp_path_factory.mktemp("base"))


@pytest.fixture(scope="module")
def accumulated(data_bin, tmp_path_factory):
    """--update-freq 2 without dropout."""
    return train(data_bin, tmp_path_factory.mktemp("accum"), "--update-freq", "2", dropout=0.0)


@pytest.mark.e2e
def test_cli_baseline_learns(baseline):
    assert _decreases(baseline), baseline


@pytest.mark.e2e
@pytest.mark.parametrize("extra", [["--checkpoint-activations"], ["--checkpoint-activations", "--offload-activations"]],
                         ids=["checkpoint", "checkpoint+offload"])
def test_cli_checkpoint_activations_reproduces_the_run(data_bin, tmp_path, baseline, extra):
    """Same seed, dropout 0.1: the logged losses equal the run without checkpointing."""
    assert train(data_bin, tmp_path, *extra) == baseline


@pytest.mark.e2e
def test_cli_update_freq_2(accumulated):
    assert _decreases(accumulated), accumulated


@pytest.mark.e2e
def test_cli_ema_checkpoint_loads(data_bin, tmp_path, baseline):
    from fairseq import checkpoint_utils

    losses = train(data_bin, tmp_path, "--ema-decay", "0.9", "--store-ema", "--ema-start-update", "1")
    assert losses == baseline  # EMA does not change the training trajectory
    path = str(tmp_path / "checkpoint_last.pt")
    state = checkpoint_utils.load_checkpoint_to_cpu(path)
    ema = state["extra_state"]["ema"]
    (model,), _cfg, _task = checkpoint_utils.load_model_ensemble_and_task([path], arg_overrides={"data": data_bin})
    assert isinstance(model, LSTransformerModel)
    live = {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(ema, strict=True)
    assert any(not torch.equal(ema[k], live[k]) for k in live if live[k].is_floating_point())
    src = torch.tensor([[4, 5, 6, 2]])
    model.eval()
    with torch.no_grad():
        out, _ = model(src, torch.tensor([4]), torch.tensor([[2, 7, 8]]))
    assert torch.isfinite(out).all()


# ------------------------------------------------------------------------- fairseq Trainer, bf16
def _trainer_losses(data_bin, precision, device="cpu", steps=3):
    from scripts.bench_support.corpus import draw_pool
    from scripts.bench_support.families import FAMILIES
    from scripts.bench_support.sides import build_trainer, train_args

    args = train_args(FAMILIES["translation"], data_bin, ROOT, "ls", "base", device, precision, (400, None),
                      layers=1, extra=[
        "--encoder-embed-dim", "32", "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
        "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
        "--dropout", "0.0", "--lr", "0.005", "--lr-scheduler", "fixed", "--warmup-updates", "0"])
    samples = draw_pool(args, steps)
    _cfg, _task, trainer = build_trainer(args)
    losses = []
    for s in samples:
        out = trainer.train_step([s])
        losses.append(float(out["loss"]))
    return trainer, losses


@pytest.mark.e2e
def test_trainer_bf16_on_cpu_matches_fp32(data_bin):
    """fairseq's Trainer bf16 path (model in bfloat16, fp32 master weights in FP16Optimizer)."""
    t16, l16 = _trainer_losses(data_bin, "bf16")
    assert all(p.dtype == torch.bfloat16 for p in t16.model.parameters())
    _, l32 = _trainer_losses(data_bin, "fp32")
    assert all(x == x for x in l16), l16
    torch.testing.assert_close(torch.tensor(l16), torch.tensor(l32), rtol=3e-2, atol=0)


@pytest.mark.cuda
def test_trainer_bf16_on_cuda_matches_fp32(data_bin):
    _, l16 = _trainer_losses(data_bin, "bf16", device="cuda")
    _, l32 = _trainer_losses(data_bin, "fp32", device="cuda")
    torch.testing.assert_close(torch.tensor(l16), torch.tensor(l32), rtol=3e-2, atol=0)


@pytest.mark.cuda
@pytest.mark.parametrize("extra", [["--fp16"], ["--amp"], ["--memory-efficient-fp16"],
                                   ["--fp16", "--checkpoint-activations"]],
                         ids=["fp16", "amp", "memory-efficient-fp16", "fp16+checkpoint"])
def test_cli_mixed_precision_on_cuda(data_bin, tmp_path, extra):
    losses = train(data_bin, tmp_path, *extra, cpu=False)
    assert _decreases(losses), losses
