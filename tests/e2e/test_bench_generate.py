"""scripts/bench_generate.py run tiny through its command line: a random tiny model and its fairseq twin
decode the same sentences through fairseq-generate's path, sides in turns. The speed is not judged
(tiny model, shared CPU); what is checked is the method and the output schema: both sides decode
every sentence of every round to the fixed length, the ratios are the ones the batch times give, the
machine is recorded. The script's parent runs in the test process (support.inprocess); its children,
one process per side and round, are forked as on every CPU run (bench_support/children.py). Marked
`e2e`."""
import json
import statistics
import sys

import pytest

from support import ROOT, inprocess

pytestmark = pytest.mark.e2e

TINY = ("--encoder-layers 1 --decoder-layers 1 --encoder-embed-dim 32 --decoder-embed-dim 32 --encoder-ffn-embed-dim 64 "
        "--decoder-ffn-embed-dim 64 --encoder-attention-heads 2 --decoder-attention-heads 2")


def bench_generate(*args, **env):
    """python -m scripts.bench_generate args (`env` added to the environment); returns (exit status, output)."""
    return inprocess.call([sys.executable, "-m", "scripts.bench_generate", *args], ROOT, **env)


def test_bench_generate_runs_both_sides_in_turns_and_writes_its_schema(tmp_path):
    out = tmp_path / "gen.json"
    rc, log = bench_generate("--sentences", "40", "--vocab", "104", "--model-args", TINY, "--tgt-len", "6",
                             "--batch-size", "16", "--beam", "3", "--threads", "1", "--rounds", "2", "--warmup", "1",
                             "--profile", "1", "--cache-dir", str(tmp_path / "cache"), "--json", str(out),
                             OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    assert rc == 0, f"bench_generate.py failed:\n{log[-6000:]}"
    res = json.loads(out.read_text())
    assert set(res["sides"]) == {"ls", "native"}
    assert res["sides"]["ls"]["model"] == "LSTransformerModel" and res["sides"]["native"]["model"] == "TransformerModel"
    for s in res["sides"].values():
        # every sentence, 6 tokens + </s> each, in both rounds; 40 sentences in batches of at most 16
        assert s["sentences_per_round"] == 40 and s["tokens_per_round"] == 40 * 7
        assert len(s["batch_s"]) == 2 and len(s["batch_s"][0]) == 3 and min(min(b) for b in s["batch_s"]) > 0
        assert s["sentences_per_s"] == pytest.approx(80 / sum(map(sum, s["batch_s"])), rel=1e-9)
        assert s["tokens_per_s"] == pytest.approx(7 * s["sentences_per_s"], rel=1e-9)
        assert len(s["per_round_sentences_per_s"]) == 2 and len(s["loadavg_at_start"]) == 2 and s["threads"] == 1
    q = res["ls_speed_over_native"]
    ls, nat = res["sides"]["ls"]["batch_s"], res["sides"]["native"]["batch_s"]
    assert q["sum"] == pytest.approx(sum(map(sum, nat)) / sum(map(sum, ls)), rel=1e-9)
    assert q["per_round"] == pytest.approx([sum(b) / sum(a) for a, b in zip(ls, nat)], rel=1e-9)
    per_batch = [tb / ta for a, b in zip(ls, nat) for ta, tb in zip(a, b)]
    assert q["batches"]["n"] == 6 and q["batches"]["median"] == pytest.approx(statistics.median(per_batch))
    assert q["rounds"]["q1"] <= q["rounds"]["median"] <= q["rounds"]["q3"]
    assert res["hypotheses"]["sentences"] == 40 and 0 <= res["hypotheses"]["identical"] <= 40
    assert res["hypotheses"]["same_tokens_per_side"]
    for side in ("ls", "native"):
        assert res["ops"][side]["top"] and res["ops"][side]["op_calls_per_step"] > 0
    m = res["machine"]
    assert {"cpu", "nproc", "loadavg_before", "loadavg_after", "torch"} <= set(m)
    assert (res["beam"], res["batch_size"], res["threads"], res["tgt_len"], res["rounds"]) == (3, 16, 1, 6, 2)
    assert "ls speed / native" in log and "identical best hypotheses" in log


def test_check_args_writes_a_stub_and_bad_arguments_are_refused(tmp_path):
    stub = tmp_path / "stub.json"
    rc, _ = bench_generate("--device", "cuda", "--check-args", "--json", str(stub))
    assert rc == 0 and json.loads(stub.read_text())["rehearsal"] is True
    rc, out = bench_generate("--path", "x.pt")
    assert rc != 0 and "--path needs the --data-bin" in out
