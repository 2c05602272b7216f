"""scripts/bench_sequence_parallel.py run tiny through its command line (1 layer, width 32, 4 heads;
T = S in {16, 33}, P in {1, 2, 4}, both modes), for translation and for the language model (--arch
ls_transformer_lm): the JSON has every cell; the bytes rank 0 sends per direction equal the
volume formulas for the whole model (recomputed here from the per-layer table); a rank of P = 2 and 4 keeps
fewer bytes for backward than one process; the fake-tensor count agrees with the real one; --arch
takes its widths from fairseq's arch function; --gloo runs 2 real processes. Times are not judged (a
shared CPU). The script runs in the test process (support.inprocess), but for --gloo, which starts
the ranks' processes itself. Marked `e2e`."""
import json
import os
import subprocess
import sys

import pytest

from support import ROOT, inprocess

pytestmark = pytest.mark.e2e

SCRIPT = ("-m", "scripts.bench_sequence_parallel")  # run from the checkout's root
TINY = ["--embed-dim", "32", "--ffn-dim", "64", "--heads", "4", "--layers", "1", "--vocab", "50", "--threads", "1"]
E, L, B, FP32 = 32, 1, 1, 4


def bench(tmp_path, *args, tiny=TINY, process=False):
    """python -m scripts.bench_sequence_parallel args; returns (the JSON, stdout: the tables). The grid
    (one process faking P ranks) runs in the test process (support.inprocess); with `process` (--gloo,
    which starts the ranks' processes itself) the script runs in its own process."""
    out = tmp_path / "sp.json"
    cmd = [sys.executable, *SCRIPT, *tiny, "--json", str(out), *args]
    if process:
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
        rc, stdout, stderr = r.returncode, r.stdout, r.stderr
    else:
        rc, stdout, stderr = inprocess.call_split(cmd, ROOT, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    assert rc == 0, f"bench_sequence_parallel.py failed:\n{stdout[-3000:]}\n{stderr[-3000:]}"
    return json.loads(out.read_text()), stdout


def volume(mode, P, T, lm=False):
    """Bytes one rank sends per direction, float32. Per layer (N = T_pad * B rows): ulysses
    self-attention 4NE(P-1)/P^2, its cross-attention 2NE(P-1)/P^2 (queries out, output back);
    allgather self-attention 2NE(P-1)/P, cross-attention nothing; plus, once, the encoder output's
    all-gather NE(P-1)/P (its backward: the reduce-scatter of as many bytes). The language model
    (lm): its decoder layers' self-attention only."""
    N = -(-T // P) * P * B
    if lm:
        return FP32 * L * N * E * (P - 1) * (4 / P ** 2 if mode == "ulysses" else 2 / P)
    if mode == "ulysses":
        per_layer = (4 * N * E * (P - 1) + 4 * N * E * (P - 1) + 2 * N * E * (P - 1)) / P ** 2
    else:
        per_layer = (2 * N * E * (P - 1) + 2 * N * E * (P - 1)) / P
    return FP32 * (L * per_layer + N * E * (P - 1) / P)


@pytest.mark.parametrize("model", [[], ["--arch", "ls_transformer_lm"]], ids=["translation", "lm"])
def test_grid_counts_volumes_and_saved_bytes(tmp_path, model):
    res, table = bench(tmp_path, *model, "--lengths", "16", "33", "--sizes", "1", "2", "4", "--warmup", "0",
                       "--reps", "1")
    lm = bool(model)
    assert res["config"]["encoder_layers"] == (0 if lm else L) and res["config"]["decoder_layers"] == L
    cells = {(c["mode"], c["P"], c["T"]): c for c in res["cells"]}
    expected = {("none", 1, T) for T in (16, 33)} | {(m, P, T) for m in ("ulysses", "allgather") for P in (2, 4)
                                                       for T in (16, 33)}
    assert set(cells) == expected
    for (mode, P, T), c in cells.items():
        want = 0 if P == 1 else volume(mode, P, T, lm)
        for kind in ("fake", "real"):
            sent = c[kind]["sent"]
            assert sent["forward"] == sent["backward"] == want == c["expected_sent"]["total"], (mode, P, T, kind, sent)
        # the fake-tensor count (what the cells too large to run use) is the real one
        assert c["fake"]["saved_bytes"] == c["real"]["saved_bytes"], (mode, P, T, c["fake"], c["real"])
        assert c["real"]["median_seconds"] > 0 and c["real"]["cuda_peak_bytes"] is None
    for mode in ("ulysses", "allgather"):
        one = cells[("none", 1, 33)]["real"]["saved_bytes"]
        two, four = (cells[(mode, P, 33)]["real"]["saved_bytes"] for P in (2, 4))
        # T = 33 is attention-heavy at width 32 ([B, H, T, T] probabilities): ~1/P of it per rank
        assert four < two < 0.9 * one and four < 0.6 * one, (mode, one, two, four)
    assert table.count("| real |") == len(expected) and "DIFFERENT" not in table


def test_memory_budget_skips_real_cells(tmp_path):
    res, table = bench(tmp_path, "--lengths", "16", "--sizes", "1", "2", "--modes", "allgather", "--max-gib", "1e-5")
    assert [c["real"]["skipped"][:6] for c in res["cells"]] == ["memory"] * 2
    assert table.count("skipped (memory)") == 4  # two columns per row
    assert all(c["fake"]["sent"]["forward"] == c["expected_sent"]["total"] for c in res["cells"])


def test_gloo_two_processes(tmp_path):
    res, out = bench(tmp_path, "--gloo-only", "--gloo-length", "32", "--gloo-embed-dim", "32", "--gloo-layers", "1",
                     "--gloo-steps", "2", process=True)
    g = res["gloo"]
    assert len(g["p1_step_seconds"]) == len(g["p2_step_seconds"]) == 2
    assert g["p1_tokens_per_s"] > 0 and g["p2_tokens_per_s"] > 0 and "ratio" in out


def test_arch_widths_and_ulysses_left_out(tmp_path):
    """--arch ls_transformer_lm_gpt: GPT-2 small's widths from fairseq's arch function (--layers given
    overrides its 12); 12 heads: ulysses is left out at P = 8, allgather runs. bf16 on the CPU under
    --fake-only (the volumes at 2 bytes an element), with SDPA and no attention dropout."""
    res, _ = bench(tmp_path, "--arch", "ls_transformer_lm_gpt", "--layers", "1", "--lengths", "64", "--sizes", "1",
                   "8", "--fake-only", "--dtype", "bf16", "--attention", "sdpa", "--attention-dropout", "0",
                   tiny=["--vocab", "50", "--threads", "1"])
    cfg = res["config"]
    assert (cfg["embed_dim"], cfg["ffn_dim"], cfg["heads"], cfg["decoder_layers"]) == (768, 3072, 12, 1), cfg
    assert (cfg["dtype"], cfg["attention"], cfg["attention_dropout"]) == ("bf16", "sdpa", 0.0), cfg
    assert res["cells"][1]["expected_sent"]["total"] == 2 * 64 * 768 * 7 // 8 * 2
    assert {(c["mode"], c["P"]) for c in res["cells"]} == {("none", 1), ("allgather", 8)}
    assert all(c["fake"]["sent"]["forward"] == c["expected_sent"]["total"] for c in res["cells"])


def test_refuses_heads_not_divisible():
    rc, _, stderr = inprocess.call_split([sys.executable, *SCRIPT, *TINY, "--sizes", "3", "--modes", "ulysses"], ROOT)
    assert rc != 0 and "--heads (4) divisible by P" in stderr
