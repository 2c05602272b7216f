"""scripts/benchmark.py run tiny through its command line, each mode once per model family: throughput
(sides in turns on pools from fairseq's loader), --host-overhead and --activation-bytes, for translation
for the LM (--family lm) and for RoBERTa's masked-LM pretraining (--family roberta); and --packed on a
tiny Multi30k-shaped corpus written by the test. The numbers are not judged (tiny models on a shared CPU); what is checked
is the method: every side trains on the identical step list, the reported ratios are the ones the
per-step times give, MFU uses the given peak and the family's FLOPs. The benchmark's parent (its
parser, the pools, the summary) runs in the test process (support.inprocess); its children, one process
per side and round, are forked as on every CPU run (bench_support/children.py; a new interpreter per
child, the CUDA way, is checked on a failing child). Marked `e2e`."""
import json
import statistics
import sys

import pytest

from support import ROOT, inprocess

pytestmark = pytest.mark.e2e

TINY = "--encoder-embed-dim 32 --decoder-embed-dim 32 --encoder-ffn-embed-dim 64 --decoder-ffn-embed-dim 64 " \
       "--encoder-attention-heads 2 --decoder-attention-heads 2"
TINY_LM = "--decoder-embed-dim 32 --decoder-input-dim 32 --decoder-output-dim 32 --decoder-ffn-embed-dim 64 " \
          "--decoder-attention-heads 2"  # input/output dims too: fairseq's transformer_lm keeps 512 otherwise
MT_CORPUS = ["--corpus-pairs", "3000", "--vocab", "304"]  # one cached data-bin for the translation tests
LM_CORPUS = ["--family", "lm", "--corpus-size", "2000", "--vocab", "104"]  # one cached data-bin for every LM test
TINY_RB = "--encoder-embed-dim 32 --encoder-ffn-embed-dim 64 --encoder-attention-heads 2"
RB_CORPUS = ["--family", "roberta", "--corpus-size", "2000", "--vocab", "104"]  # the LM's data-bin (same builder)


def benchmark(*args):
    """python -m scripts.benchmark args, one thread per process; returns (exit status, output)."""
    return inprocess.call([sys.executable, "-m", "scripts.benchmark", *args], ROOT, OMP_NUM_THREADS="1",
                          PYTHONWARNINGS="ignore")


def bench(tmp_path, name, *args, cache):
    out = tmp_path / f"{name}.json"
    rc, log = benchmark("--device", "cpu", "--cache-dir", str(cache), "--json", str(out), *args)
    assert rc == 0, f"benchmark.py {' '.join(args)} failed:\n{log[-6000:]}"
    return json.loads(out.read_text()), log


@pytest.fixture(scope="module")
def mt_cache(tmp_path_factory):
    """One cache dir for the translation tests: the synthetic corpus is written once."""
    return tmp_path_factory.mktemp("mt_cache")


def test_throughput_sides_train_on_the_same_steps(tmp_path, mt_cache):
    res, log = bench(tmp_path, "tp", *MT_CORPUS, "--layers", "1", "--extra", TINY,
                     "--max-tokens", "256", "--pool", "3", "--warmup", "1", "--steps", "4", "--rounds", "2",
                     "--sides", "ls,fairseq,fairseq_fused", "--peak-tflops", "2.0", "--threads", "1", cache=mt_cache)
    row = res["precisions"]["fp32"]["shapes"]["256"]
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


def test_host_overhead_profiles_both_sides(tmp_path, mt_cache):
    res, log = bench(tmp_path, "host", "--host-overhead", "--host-pairs", "500", "--host-vocab", "104",
                     "--pool", "2", "--warmup", "1", "--steps", "3", "--rounds", "1", "--ops-steps", "1",
                     cache=mt_cache)
    assert set(res["sides"]) == {"ls", "fairseq"}
    assert res["ls_over_base"] == pytest.approx(res["sides"]["ls"]["median_ms"] / res["sides"]["fairseq"]["median_ms"])
    for s in res["sides"].values():
        assert s["ops"]["op_calls_per_step"] > 100 and s["ops"]["backward_nodes_per_step"] > 10
        assert len(s["ops"]["top"]) == 15
    assert "target <= 0.5x" in log


def test_host_overhead_without_a_baseline_is_refused(tmp_path):
    rc, out = benchmark("--host-overhead", "--sides", "ls", "--cache-dir", str(tmp_path / "cache"))
    assert rc != 0 and "--sides must name ls and fairseq" in out


@pytest.mark.parametrize("attention", ["auto", "sdpa"])
def test_activation_bytes_counts_both_sides(tmp_path, mt_cache, attention):
    res, log = bench(tmp_path, "act", "--activation-bytes", *MT_CORPUS, "--act-sizes", "base", "--layers", "1",
                     "--max-tokens", "256", "--extra", TINY, "--ls-attention", attention, cache=mt_cache)
    assert res["ls_attention"] == attention
    row = res["sizes"]["base"]["256"]
    assert row["ls"]["bytes"] > 0 and row["fairseq"]["bytes"] > 0
    assert row["ls"]["batch"] == row["fairseq"]["batch"]
    assert row["ratio"] == pytest.approx(row["ls"]["bytes"] / row["fairseq"]["bytes"])
    assert "target <= 0.6x" in log


@pytest.fixture(scope="module")
def lm_cache(tmp_path_factory):
    """One cache dir for the LM tests: the tiny corpus goes through fairseq-preprocess once."""
    return tmp_path_factory.mktemp("lm_cache")


def test_lm_throughput_sides_train_on_the_same_blocks(tmp_path, lm_cache):
    # one round per side: the split of the step list into rounds is checked on translation. Two threads:
    # the forked children (bench_support/children.py) take the count asked for, and OpenMP works in them.
    res, log = bench(tmp_path, "lm_tp", *LM_CORPUS, "--layers", "1", "--extra", TINY_LM, "--max-tokens", "256",
                     "--seq-len", "32,64", "--pool", "3", "--warmup", "1", "--steps", "4", "--rounds", "1",
                     "--sides", "ls,fairseq", "--peak-tflops", "2.0", "--threads", "2", cache=lm_cache)
    assert res["family"] == "lm"
    prec = res["precisions"]["fp32"]
    assert prec["threads"] == 2
    shape = prec["model"]
    assert shape["enc_layers"] == 0 and shape["dec_layers"] == 1 and shape["embed_dim"] == 32
    assert set(prec["shapes"]) == {"256@T32", "256@T64"}
    for label, T in (("256@T32", 32), ("256@T64", 64)):
        row = prec["shapes"][label]
        sides = row["sides"]
        assert len({s["target_checksum"] for s in sides.values()}) == 1
        tokens = row["step_tgt_tokens"]
        assert len(tokens) == 4 and tokens[3] == tokens[0] and max(tokens) <= 256
        # full blocks of T: the LM's FLOPs are 6 x (layer + output params) x N + 12 x d x layers x N x T
        flops = sum(6.0 * (shape["dec_layer_params"] + shape["out_proj_params"]) * n + 12.0 * 32 * n * T
                    for n in tokens)
        for s in sides.values():
            assert s["tflops_per_s"] == pytest.approx(flops / (sum(s["step_ms"]) / 1e3) / 1e12, rel=1e-6)
            assert s["mfu"] == pytest.approx(s["tflops_per_s"] / 2.0)
        assert sides["fairseq"]["ls_speedup_sum"] == pytest.approx(
            sum(sides["fairseq"]["step_ms"]) / sum(sides["ls"]["step_ms"]))
        assert row["pad_fraction"]["tgt"] < 0.05
    assert "256@T64" in log


@pytest.mark.parametrize("family,depth", [("lm", "transformer_lm_gpt"), ("roberta", "roberta_base")])
def test_block_family_host_overhead_profiles_both_sides(tmp_path, lm_cache, family, depth):
    res, log = bench(tmp_path, f"{family}_host", "--family", family, "--host-overhead", "--host-pairs", "2000",
                     "--host-vocab", "104", "--max-tokens", "128", "--seq-len", "32", "--pool", "2", "--warmup", "1",
                     "--steps", "2", "--rounds", "1", "--ops-steps", "1", cache=lm_cache)
    assert res["family"] == family and res["shape"] == "128@T32"
    for s in res["sides"].values():
        assert s["ops"]["backward_nodes_per_step"] > 10
    assert f"{depth} depth" in log and "target <= 0.5x" in log


def test_lm_activation_bytes_at_each_block_length(tmp_path, lm_cache):
    res, log = bench(tmp_path, "lm_act", *LM_CORPUS, "--activation-bytes", "--act-sizes", "base", "--layers", "1",
                     "--max-tokens", "128", "--seq-len", "32,128", "--extra", TINY_LM, cache=lm_cache)
    rows = res["sizes"]["base"]
    assert set(rows) == {"128@T32", "128@T128"}
    assert rows["128@T32"]["ls"]["batch"] == [4, 32] and rows["128@T128"]["fairseq"]["batch"] == [1, 128]
    for row in rows.values():
        assert row["ratio"] == pytest.approx(row["ls"]["bytes"] / row["fairseq"]["bytes"])
    # the explicit attention's [B, H, T, T] grows with T at a fixed token count: more bytes at T = 128
    assert rows["128@T128"]["fairseq"]["bytes"] > rows["128@T32"]["fairseq"]["bytes"]
    assert "target <= 0.6x" in log


def test_roberta_throughput_counts_input_tokens_and_masked_head_flops(tmp_path, lm_cache):
    # one round per side: the split of the step list into rounds is checked on translation
    res, log = bench(tmp_path, "rb_tp", *RB_CORPUS, "--layers", "1", "--extra", TINY_RB, "--max-tokens", "256",
                     "--seq-len", "64", "--pool", "3", "--warmup", "1", "--steps", "4", "--rounds", "1",
                     "--sides", "ls,fairseq,fairseq_fused", "--peak-tflops", "2.0", "--threads", "1", cache=lm_cache)
    assert res["family"] == "roberta" and res["tokens"].startswith("input tokens")
    prec = res["precisions"]["fp32"]
    shape = prec["model"]
    assert shape["enc_layers"] == 1 and shape["dec_layers"] == 0 and shape["embed_dim"] == 32
    # the LM head: the dense d x d layer and the tied projection (104 words + <mask>)
    assert shape["out_proj_params"] == 32 * 32 + 105 * 32
    row = prec["shapes"]["256@T64"]
    sides = row["sides"]
    assert set(sides) == {"ls", "fairseq", "fairseq_fused"}
    assert len({s["target_checksum"] for s in sides.values()}) == 1
    tokens = row["step_tgt_tokens"]
    # blocks of exactly T = 64 input tokens (<s> + 63), 4 of them at 256 tokens: tok/s counts them all
    assert tokens == [256, 256, 256, 256]
    pf = row["pad_fraction"]
    assert pf["src"] == 0 and pf["tgt"] is None and 0.05 < pf["masked"] < 0.3
    # the head's FLOPs are on the masked rows (not in the JSON per step): between none and all of the rows
    dense_all = sum(6.0 * (shape["enc_layer_params"] + shape["out_proj_params"]) * n + 12.0 * 32 * n * 64
                    for n in tokens)
    dense_none = sum(6.0 * shape["enc_layer_params"] * n + 12.0 * 32 * n * 64 for n in tokens)
    for s in sides.values():
        flops = s["tflops_per_s"] * 1e12 * sum(s["step_ms"]) / 1e3
        assert dense_none < flops < dense_all
        assert s["mfu"] == pytest.approx(s["tflops_per_s"] / 2.0)
        assert s["tgt_tokens_per_s"] == pytest.approx(sum(tokens) / (sum(s["step_ms"]) / 1e3), rel=1e-9)
    assert sides["fairseq"]["ls_speedup_sum"] == pytest.approx(
        sum(sides["fairseq"]["step_ms"]) / sum(sides["ls"]["step_ms"]))
    assert "masked" in log and "tok/s counts input tokens" in log


def test_roberta_activation_bytes(tmp_path, lm_cache):
    res, log = bench(tmp_path, "rb_act", *RB_CORPUS, "--activation-bytes", "--act-sizes", "base", "--layers", "1",
                     "--max-tokens", "128", "--seq-len", "64", "--extra", TINY_RB, cache=lm_cache)
    row = res["sizes"]["base"]["128@T64"]
    assert row["ls"]["batch"] == row["fairseq"]["batch"] == [2, 64]
    assert row["ls"]["tgt_tokens"] == 128  # ntokens: every input token
    assert row["ratio"] == pytest.approx(row["ls"]["bytes"] / row["fairseq"]["bytes"])
    assert "target <= 0.6x" in log


def test_seq_len_is_refused_for_translation(tmp_path):
    rc, out = benchmark("--seq-len", "512", "--cache-dir", str(tmp_path / "cache"))
    assert rc != 0 and "batches sentences by --max-tokens only" in out


def write_multi30k_like(d, n=300):
    """d/train.en.gz and d/train.de.gz: n raw sentence pairs of 3 to 20 words (capitalised, punctuation
    attached to the words as in Multi30k), the shape of the real corpus, made here."""
    import gzip
    import random

    rng = random.Random(0)
    words = "a man woman dog child runs sits in on the park street red blue young".split()
    d.mkdir(parents=True, exist_ok=True)
    with gzip.open(d / "train.en.gz", "wt") as en, gzip.open(d / "train.de.gz", "wt") as de:
        for _ in range(n):
            k = rng.randint(3, 20)
            en.write(" ".join(rng.choices(words, k=k)).capitalize() + ".\n")
            de.write(" ".join(rng.choices(words, k=max(2, k + rng.randint(-2, 2)))).capitalize() + ".\n")
    return d


def test_packed_mode_times_packed_padded_and_fairseq_on_real_batches(tmp_path):
    corpus = write_multi30k_like(tmp_path / "multi30k")
    res, log = bench(tmp_path, "packed", "--packed", "--multi30k", str(corpus), "--tiny", "--cases", "sentence,sweep",
                     "--pool", "2", "--warmup", "1", "--steps", "2", "--rounds", "1", "--ops-steps", "1",
                     "--sweep-batch", "8x16", "--sweep-pads", "0,0.4", cache=tmp_path / "cache")
    assert res["mode"] == "packed" and len(res["commit"]) == 40 and res["threads"] == 1
    assert "<multi30k>" in res["argv"] and str(corpus) not in json.dumps(res)  # the corpus folder scrubbed
    row = res["cases"]["sentence"]["pools"]["sentence"]
    assert set(row["sides"]) == {"ls_packed", "ls_padded", "fairseq", "fairseq_fused"}
    assert len({s["target_checksum"] for s in row["sides"].values()}) == 1
    assert [b[0] for b in row["batches"]] == [32, 32]  # fairseq's loader at --batch-size 32
    p = row["padding"]
    assert 0 < p["all"] == p["src"] < 1 and p["tgt"] is None and p["ideal"] == pytest.approx(1 / (1 - p["all"]))
    packed_ms, padded_ms = row["sides"]["ls_packed"]["step_ms"], row["sides"]["ls_padded"]["step_ms"]
    q = row["packed_over_padded"]
    assert q["sum"] == pytest.approx(sum(padded_ms) / sum(packed_ms)) and q["target"] == 1.5
    assert q["per_step"]["median"] == pytest.approx(statistics.median(b / a for a, b in zip(packed_ms, padded_ms)))
    sb = row["saved_bytes"]
    assert sb["packed_over_padded"] == pytest.approx(sb["ls_packed"]["bytes"] / sb["ls_padded"]["bytes"])
    for s in row["sides"].values():
        assert s["ops"]["top"] and s["median_ms"] > 0
    sweep = res["cases"]["sweep"]
    assert set(sweep["pools"]) == {"pad0.00", "pad0.40"} and "saved_bytes" not in sweep["pools"]["pad0.00"]
    assert sweep["pools"]["pad0.00"]["padding"]["all"] == 0 and sweep["pools"]["pad0.00"]["batches"] == [[8, 16]] * 2
    assert 0.3 < sweep["pools"]["pad0.40"]["padding"]["all"] < 0.5 and sweep["break_even"]["note"]
    assert "packed/padded [IQR]" in log and "sweep (8x16 batches)" in log


def test_packed_mode_names_a_missing_corpus(tmp_path):
    rc, out = benchmark("--packed", "--multi30k", str(tmp_path / "none"))
    assert rc != 0 and "--multi30k" in out and "train.en.gz" in out


@pytest.mark.parametrize("fork", [True, False])
def test_a_failing_child_shows_its_output(fork):
    """A child that fails (here: fairseq refuses the arguments) raises with its own output (the traceback
    names fairseq's parser), forked or new."""
    from scripts.bench_support import children
    with pytest.raises(RuntimeError, match="(?s)scripts.benchmark child .*--no-such-option.*parse_args_and_arch"):
        children.run("scripts.benchmark:child", {"kind": "act", "args": ["--no-such-option"], "pool": "none"},
                     ROOT, threads=1, fork=fork)
