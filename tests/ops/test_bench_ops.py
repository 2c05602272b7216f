"""scripts/bench_ops.py: it runs (a tiny shape, every op); every public op has a benchmark; the
compositions it times us against compute what the ops compute, paying for a linear's bias as fairseq
does; on CUDA its kernel timer agrees with CUDA events on a copy, whose device time is all kernel."""
import json
import os

import pytest
import torch

from fairseq_lightseq import info

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from scripts import bench_ops  # noqa: E402  (the source tree is on sys.path: tests/conftest.py)

OPS = {c[0] for c in bench_ops.cases(bench_ops.SHAPES["tiny"], "cpu", torch.float32)}  # the case names


def _run(tmp_path, device, dtype):
    out = tmp_path / "bench.json"
    bench_ops.main(["--device", device, "--dtype", dtype, "--shapes", "tiny", "--repeats", "2", "--json", str(out)])
    return json.loads(out.read_text())["rows"]


def test_bench_ops_runs_every_op_cpu(tmp_path):
    rows = _run(tmp_path, "cpu", "fp32")
    assert {r["op"] for r in rows} == OPS
    for r in rows:
        assert r["ours_ms"] > 0 and r["comp_ms"] > 0 and r["ref_ms"] > 0, r


def test_every_public_op_is_benchmarked():
    """The checklist (docs/adding_an_op.md) makes a bench entry part of a new op group: every public op is a
    case of bench_ops.cases() (a name or "name[variant]") or is listed in TIMED_ELSEWHERE with a script
    that exists."""
    public = set(info.public_ops())
    timed = {name.split("[")[0] for name in OPS}
    assert sorted(public - timed - set(bench_ops.TIMED_ELSEWHERE)) == []
    assert set(bench_ops.TIMED_ELSEWHERE) <= public and not timed & set(bench_ops.TIMED_ELSEWHERE)
    for script in filter(None, bench_ops.TIMED_ELSEWHERE.values()):
        assert os.path.isfile(os.path.join(REPO, script)), script


def test_elsewhere_cases_are_timed_elsewhere_and_have_ideal_bytes_per_pass():
    """cases(elsewhere=True), the kernel profile's list, adds only ops of TIMED_ELSEWHERE; every case has its ideal
    bytes, one count per pass (forward and backward, or the one pass of an op without a backward), and runs."""
    s = bench_ops.SHAPES["tiny"]
    every = bench_ops.cases(s, "cpu", torch.float32, elsewhere=True)
    extra = {c[0] for c in every} - OPS
    assert extra == {"label_smoothed_cross_entropy", "adam_step"} and extra <= set(bench_ops.TIMED_ELSEWHERE)
    nbytes = bench_ops.ideal_bytes(s, 4)
    assert set(nbytes) == OPS | extra
    for name, inputs, grad_out, ours, _, _, bf, bb in every:
        assert len(nbytes[name]) == (1 if grad_out is None else 2) and bf > 0, name
        if name in extra:
            y = ours(*inputs)
            if grad_out is not None:
                torch.autograd.backward(y, grad_out)
            else:
                assert bb is None


@pytest.mark.cuda
def test_kernel_seconds_matches_events_on_a_copy():
    src = torch.randn(64 << 20, device="cuda")  # 256 MB: the copy's wall time is its kernel time
    dst = torch.empty_like(src)
    k = bench_ops.kernel_seconds(lambda: dst.copy_(src))
    wall = bench_ops.timeit(lambda: dst.copy_(src), "cuda")
    assert 0.7 * wall < k <= 1.05 * wall, (k, wall)


@pytest.mark.cuda
def test_bench_ops_cuda_columns(tmp_path):
    rows = {r["op"]: r for r in _run(tmp_path, "cuda", "fp16")}
    assert set(rows) == OPS
    assert rows["merge_heads"]["bwd_bw_frac"] is None  # its backward is a view: no kernel runs
    for name, r in rows.items():
        assert r["ours_kernel_ms"] > 0 and r["comp_kernel_ms"] > 0, name
        assert r["fwd_bw_frac"] > 0 and r["fwd_top_kernels_us"], name


def test_top_kernels_shortens_names_longest_first():
    times = {"void fls::cuda::(anonymous namespace)::softmax_fwd_vec_kernel<__half, 16, 1>(__half const*, int)": 1e-5,
             "Memset (Device)": 2e-6,
             "void at::native::elementwise_kernel<128, 4>(int, at::native::Loop)": 3e-6}
    assert bench_ops.top_kernels(times, k=2) == [("fls::cuda::softmax_fwd_vec_kernel<__half, 16, 1>", 10.0),
                                                  ("at::native::elementwise_kernel<128, 4>", 3.0)]


def test_compositions_compute_what_the_ops_compute():
    """The PyTorch compositions we time against must be the same function (the ops without dropout).
    The QKV composition takes its input as the biased projection (BiasInLinear: fairseq's GEMM adds
    the bias), so the op is checked with a zero bias there."""
    checked = 0
    for name, inputs, _, _, ref, comp, _, _ in bench_ops.cases(bench_ops.SHAPES["tiny"], "cpu", torch.float64):
        if name in ("layer_norm", "qkv_bias_split", "merge_heads"):
            a = comp(*inputs)
            b = ref(inputs[0], torch.zeros_like(inputs[1])) if name == "qkv_bias_split" else ref(*inputs)
            for x, y in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,)):
                torch.testing.assert_close(x, y)
            checked += 1
    assert checked == 3


def test_bias_in_linear_is_free_forward_and_owes_the_bias_gradient():
    x = torch.randn(2, 3, 5, dtype=torch.float64, requires_grad=True)
    b = torch.randn(5, dtype=torch.float64, requires_grad=True)
    y = bench_ops.BiasInLinear.apply(x, b)
    assert torch.equal(y, x)
    dy = torch.randn(2, 3, 5, dtype=torch.float64)
    y.backward(dy)
    assert torch.equal(x.grad, dy) and torch.allclose(b.grad, dy.sum((0, 1)))
