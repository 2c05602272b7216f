"""The benchmark's measuring helpers (scripts/bench_support): the saved-bytes counter counts each
storage once and leaves parameters out, finds tensors kept as ctx attributes; the GPU-busy fraction
is the union of kernel intervals over the window; the fused AdamW baseline is fairseq's Adam; the
family table gives every side of every family its arguments."""
import json
import os
from types import SimpleNamespace

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from scripts.bench_support.fused_adamw import BenchFusedAdamW
from scripts.bench_support.provenance import record
from scripts.bench_support.saved_bytes import SavedBytes
from scripts.bench_support.timing import _busy_fraction


def test_saved_bytes_counts_each_storage_once_and_skips_parameters():
    torch.manual_seed(0)
    x = torch.randn(64, 16, requires_grad=True)
    w = torch.nn.Parameter(torch.randn(16, 16))
    with SavedBytes([w]) as sb:
        y = x @ w  # saves x (64x16) and w (a parameter: not counted)
        z = y.exp()  # saves its output z (64x16)
        v = z.t().sigmoid()  # saves its output: a new storage (16x64)
        u = z[:8].tanh()  # saves its output (8x16)
        m = z.t() @ x  # saves z.t() (a view: z's storage, counted) and x (counted)
    sb.finish(m.sum() + u.sum() + v.sum())
    assert sb.bytes == 4 * (64 * 16 + 64 * 16 + 16 * 64 + 8 * 16)
    assert sb.tensors == 4


class _KeepsOnCtx(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.kept = x * 3  # not through save_for_backward: the hooks do not see it
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * ctx.kept


def test_saved_bytes_finds_tensors_kept_as_ctx_attributes():
    x = torch.randn(10, 10, requires_grad=True)
    with SavedBytes() as sb:
        y = _KeepsOnCtx.apply(x)
    sb.finish(y)
    assert sb.from_ctx == 400 and sb.bytes == 400


def test_busy_fraction_is_the_union_of_kernel_intervals(tmp_path):
    events = [{"cat": "user_annotation", "name": "bench_step", "ts": 0, "dur": 50},
              {"cat": "user_annotation", "name": "bench_step", "ts": 50, "dur": 40},
              {"cat": "kernel", "name": "a", "ts": 10, "dur": 20},
              {"cat": "kernel", "name": "b", "ts": 20, "dur": 20},  # overlaps a: [10, 40)
              {"cat": "gpu_memcpy", "name": "c", "ts": 60, "dur": 10},
              {"cat": "kernel", "name": "d", "ts": 90, "dur": 10},  # the window ends at 100
              {"cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 100}]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    assert _busy_fraction(str(path)) == pytest.approx((30 + 10 + 10) / 100)


def test_fused_adamw_baseline_steps_like_fairseq_adam():
    from fairseq.optim.adam import FairseqAdam

    torch.manual_seed(0)
    cfg = SimpleNamespace(lr=[1e-3], adam_betas="(0.9, 0.98)", adam_eps=1e-8, weight_decay=0.0,
                          use_old_adam=False, fp16_adam_stats=False, tpu=False)
    ours = [torch.nn.Parameter(torch.randn(37, 5)), torch.nn.Parameter(torch.randn(11))]
    ref = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    start = [p.detach().clone() for p in ours]
    a, b = BenchFusedAdamW(cfg, ours), FairseqAdam(cfg, ref)
    for _ in range(3):
        for p, q in zip(ours, ref):
            p.grad = torch.randn_like(p)
            q.grad = p.grad.clone()
        a.step()
        b.step()
    for p, q, p0 in zip(ours, ref, start):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
        assert (p - p0).abs().mean() > 5e-4  # the step did move them (lr 1e-3)


@pytest.mark.parametrize("family", ["translation", "lm", "roberta", "bart"])
@pytest.mark.parametrize("side", ["ls", "fairseq", "fairseq_fused"])
def test_every_family_gives_each_side_its_model_criterion_and_optimizer(family, side):
    """bench_support/families.py is the benchmark's one table: each family's sides parse with fairseq's
    own training parser into the family's task, ours or fairseq's arch and criterion, and the side's
    optimizer; the tiny width sets every stack (and the LM's input/output dims)."""
    from fairseq import options
    from fairseq_lightseq.models.families import FAMILIES as LIBRARY

    from scripts.bench_support.families import FAMILIES, tiny_width_args
    from scripts.bench_support.fused_adamw import register
    from scripts.bench_support.sides import train_args

    register()
    fam = FAMILIES[family]
    lib = LIBRARY[fam.library]
    shape = (1024, 512 if fam.seq_len else None)
    args = train_args(fam, "/nonexistent", ROOT, side, "base", "cpu", "fp32", shape, 3, tiny_width_args(fam))
    ns = options.parse_args_and_arch(options.get_training_parser(), input_args=args)
    ours = side == "ls"
    assert ns.task == lib.task and ns.arch == ("ls_" if ours else "") + fam.archs["base"]
    assert ns.criterion == (lib.criterion if ours else lib.native_criterion)
    assert ns.optimizer == {"ls": "ls_adam", "fairseq": "adam", "fairseq_fused": "bench_fused_adamw"}[side]
    assert ns.max_tokens == 1024
    for stack in fam.stacks:
        assert getattr(ns, f"{stack}_layers") == 3 and getattr(ns, f"{stack}_embed_dim") == 32
    for dim in fam.embed_dims:
        assert getattr(ns, dim.replace("-", "_")) == 32
    if fam.seq_len:
        assert ns.tokens_per_sample == 512
    assert fam.stacks == {"translation": ("encoder", "decoder"), "lm": ("decoder",), "roberta": ("encoder",),
                          "bart": ("encoder", "decoder")}[family]


def test_a_benchmark_record_names_the_commit_and_no_machine_path(tmp_path):
    """What every benchmark JSON gets (bench_support/provenance.py): the measured tree's HEAD, and its
    checkout, the temporary directory and the home directory replaced by placeholders."""
    import subprocess
    import tempfile

    head = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
    res = record({"repo": ROOT, "argv": ["--json", os.path.join(tempfile.gettempdir(), "x.json")],
                  "nested": {"data_bin": os.path.join(os.path.expanduser("~"), "bins", "wmt"), "n": 3}}, ROOT)
    assert res["commit"] == head.stdout.strip() and isinstance(res["dirty"], bool)
    assert res["repo"] == "<repo>" and res["argv"] == ["--json", "<tmp>/x.json"]
    assert res["nested"] == {"data_bin": "<home>/bins/wmt", "n": 3}
    outside = record({"repo": str(tmp_path)}, str(tmp_path))  # not a git checkout
    assert outside["commit"] is None and outside["dirty"] is None
