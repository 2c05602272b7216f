"""scripts/benchmark.py run tiny through its command line, each mode once: throughput (sides in turns
on one pool from fairseq's loader), --host-overhead and --activation-bytes. The numbers are not judged
(tiny models on a shared CPU); what is checked is the method: every side trains on the identical step
list, the reported ratios are the ones the per-step times give, MFU uses the given peak. Marked `e2e`."""
import json
import os
import statistics
import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = "--encoder-embed-dim 32 --decoder-embed-dim 32 --encoder-ffn-embed-dim 64 --decoder-ffn-embed-dim 64 " \
       "--encoder-attention-heads 2 --decoder-attention-heads 2"


def bench(tmp_path, name, *args):
    out = tmp_path / f"{name}.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "benchmark.py"), "--device", "cpu",
                        "--cache-dir", str(tmp_path / "cache"), "--json", str(out), *args],
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, f"benchmark.py {' '.join(args)} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return json.loads(out.read_text()), r.stdout


def test_throughput_sides_train_on_the_same_steps(tmp_path):
    res, log = bench(tmp_path, "tp", "--corpus-pairs", "3000", "--vocab", "304", "--layers", "1", "--extra", TINY,
                     "--max-tokens", "256", "--pool", "3", "--warmup", "1", "--steps", "4", "--rounds", "2",
                     "--sides", "ls,fairseq,fairseq_fused", "--peak-tflops", "2.0", "--threads", "1")
    row = res["precisions"]["fp32"]["max_tokens"]["256"]
    sides = row["sides"]
    assert set(sides) == {"ls", "fairseq", "fairseq_fused"}
    # the same 4 steps (pool batches 0, 1, 2, 0) on every side, 2 in each round
    assert len({s["target_checksum"] for s in sides.values()}) == 1
    tokens = row["step_tgt_tokens"]
    assert len(tokens) == 4 and tokens[3] == tokens[0]
    ls_ms = sides["ls"]["step_ms"]
    for name, s in sides.items():
        assert len(s["step_ms"]) == 4 and min(s["step_ms"]) > 0 and s["skipped"] == 0
        assert s["tgt_tokens_per_s"] == pytest.approx(sum(tokens) / (sum(s["step_ms"]) / 1e3), rel=1e-9)
        assert len(s["per_round_tokens_per_s"]) == 2
        assert s["mfu"] == pytest.approx(s["tflops_per_s"] / 2.0)
        if name != "ls":
            assert s["ls_speedup_sum"] == pytest.approx(sum(s["step_ms"]) / sum(ls_ms))
            ratios = [b / a for a, b in zip(ls_ms, s["step_ms"])]
            assert s["ls_speedup_per_step"]["median"] == pytest.approx(statistics.median(ratios))
            q = s["ls_speedup_per_step"]
            assert q["q1"] <= q["median"] <= q["q3"]
    assert 0 <= row["pad_fraction"]["all"] < 0.5
    assert "per-step median [IQR]" in log and "pad fraction" in log


def test_host_overhead_profiles_both_sides(tmp_path):
    res, log = bench(tmp_path, "host", "--host-overhead", "--host-pairs", "500", "--host-vocab", "104",
                     "--pool", "2", "--warmup", "1", "--steps", "3", "--rounds", "1", "--ops-steps", "1")
    assert set(res["sides"]) == {"ls", "fairseq"}
    assert res["ls_over_base"] == pytest.approx(res["sides"]["ls"]["median_ms"] / res["sides"]["fairseq"]["median_ms"])
    for s in res["sides"].values():
        assert s["ops"]["op_calls_per_step"] > 100 and s["ops"]["backward_nodes_per_step"] > 10
        assert len(s["ops"]["top"]) == 15
    assert "target <= 0.5x" in log


def test_host_overhead_without_a_baseline_is_refused(tmp_path):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "benchmark.py"), "--host-overhead", "--sides",
                        "ls", "--cache-dir", str(tmp_path / "cache")], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "--sides must name ls and fairseq" in r.stderr


@pytest.mark.parametrize("attention", ["auto", "sdpa"])
def test_activation_bytes_counts_both_sides(tmp_path, attention):
    res, log = bench(tmp_path, "act", "--activation-bytes", "--corpus-pairs", "3000", "--vocab", "304",
                     "--act-sizes", "base", "--layers", "1", "--max-tokens", "256", "--extra", TINY,
                     "--ls-attention", attention)
    assert res["ls_attention"] == attention
    row = res["sizes"]["base"]
    assert row["ls"]["bytes"] > 0 and row["fairseq"]["bytes"] > 0
    assert row["ls"]["batch"] == row["fairseq"]["batch"]
    assert row["ratio"] == pytest.approx(row["ls"]["bytes"] / row["fairseq"]["bytes"])
    assert "target <= 0.6x" in log
