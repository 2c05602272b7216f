"""scripts/bench_varlen_attention.py: the two sides it times compute the same attention (the packed side on
the padded side's real rows), and the script runs (a tiny case) and writes its rows."""
import json

import torch

from scripts import bench_varlen_attention as bench  # (the source tree is on sys.path: tests/conftest.py)


def test_the_sides_compute_the_same_gradients():
    """Padding (p = 0.1: the same masks, VarlenCoords' default), a causal and a cross shape."""
    for causal, (Tq, Tk) in ((False, (5, 6)), (True, (7, 7))):
        c = bench.sides(3, Tq, Tk, 2, 8, causal, padded=True, p=0.1)
        assert min(c.lq) < Tq
        c.padded()
        c.packed()
        for padded, packed, n in zip(c.padded_leaves, c.packed_leaves, (c.lq, c.lk, c.lk)):
            torch.testing.assert_close(bench._packed(padded.grad, n), packed.grad)


def test_runs_and_writes_its_rows(tmp_path):
    out = tmp_path / "varlen.json"
    bench.main(["--tiny", "--repeats", "2", "--warmup", "1", "--json", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert {(r["padded"], r["p"]) for r in rows} == {(False, 0.0), (False, 0.1), (True, 0.0), (True, 0.1)}
    for r in rows:
        assert r["padded_ms"][0] > 0 and r["varlen_ms"][0] > 0, r
