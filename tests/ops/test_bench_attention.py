"""scripts/bench_attention.py without a GPU: the length mixes are fairseq's (translation batches within
--max-tokens in fairseq's order, complete-mode RoBERTa blocks), the FLOP count, the sides compute the same
gradients (ours over packed rows, SDPA over the padded batch), and the script runs on a tiny corpus on the CPU,
writing its rows with torch's flash cells marked as not timed, naming why."""
import gzip
import json

import pytest
import torch

from scripts import bench_attention as bench  # (the source tree is on sys.path: tests/conftest.py)


def test_translation_batches_are_fairseqs():
    g = torch.Generator().manual_seed(0)
    src = torch.randint(2, 40, (500,), generator=g).tolist()
    tgt = torch.randint(2, 40, (500,), generator=g).tolist()
    batches = bench.mt_batches(src, tgt, 256, 3)
    assert len(batches) == 3
    firsts = []
    for s, t in batches:
        assert len(s) * max(s + t) <= 256 and len(s) == len(t)
        assert s == sorted(s)  # ordered by source length
        firsts.append(s[0])
    assert firsts == sorted(firsts) and firsts[0] < firsts[-1]  # spread over the order


def test_complete_blocks_hold_whole_sentences_up_to_t():
    lengths = [5, 7, 3, 9, 30, 2]
    blocks = bench.complete_blocks(lengths, 16)
    assert blocks == [5 + 7 + 3 + 1, 9 + 1, 15 + 1, 2 + 1]  # <s> each; the 30-token sentence cut to T - 1
    rows = bench.roberta_batches(blocks, 16, 64, 2)
    assert len(rows) == 2 and all(len(q) == 4 and q == k for q, k in rows)


def test_useful_flops_count_real_pairs_causal_half():
    assert bench.useful_flops([3, 2], [4, 5], 2, 8, False) == 3.5 * 4 * 8 * 2 * (12 + 10)
    assert bench.useful_flops([3, 2], [3, 2], 2, 8, True) == 3.5 * 4 * 8 * 2 * (6 + 3)


@pytest.mark.parametrize("kind,lq,lk,causal", [("encoder", [5, 1, 3], [5, 1, 3], False),
                                               ("decoder", [4, 1, 6], [4, 1, 6], True),
                                               ("cross", [3, 6, 1], [5, 2, 7], False)])
def test_the_sides_compute_the_same_gradients(kind, lq, lk, causal):
    s = bench.sides(bench.Attention("mt", 0, kind, lq, lk, causal), 2, 8, torch.float32, "cpu", 0.0)
    assert isinstance(s.fns["flash"], str) and "CUDA" in s.fns["flash"]
    s.fns["ours"]()
    s.fns["sdpa_padded"]()
    for packed, padded, n in zip(s.packed, s.padded, (lq, lk, lk)):
        torch.testing.assert_close(bench._padded(packed.grad, n, max(n)), padded.grad, rtol=1e-4, atol=1e-5)


def test_runs_on_a_tiny_corpus_and_writes_its_rows(tmp_path):
    corpus = tmp_path / "multi30k"
    corpus.mkdir()
    for lang, words in (("en", "a man rides a horse ."), ("de", "ein Mann reitet ein Pferd .")):
        with gzip.open(corpus / f"train.{lang}.gz", "wt") as f:
            f.writelines(" ".join(words.split()[: 2 + i % 5]) + "\n" for i in range(60))
    out = tmp_path / "attention.json"
    bench.main(["--device", "cpu", "--multi30k", str(corpus), "--dtypes", "bf16", "--p", "0,0.1", "--max-tokens",
                "64", "--batches", "1", "--warmup", "1", "--repeats", "2", "--json", str(out)])
    res = json.loads(out.read_text())
    assert {(r["mix"], r["attention"]) for r in res["rows"]} == {
        ("mt", "encoder"), ("mt", "decoder"), ("mt", "cross"), ("roberta128", "encoder"), ("roberta512", "encoder")}
    for r in res["rows"]:
        assert r["sides"]["ours"]["ms"][0] > 0 and r["sides"]["sdpa_padded"]["tflops"] > 0
        assert "CUDA only" in r["sides"]["flash"]["skipped"]
    assert str(corpus) not in out.read_text()


def test_a_missing_corpus_names_the_option(tmp_path, capsys):
    with pytest.raises(SystemExit):
        bench.main(["--device", "cpu", "--multi30k", str(tmp_path)])
    assert "--multi30k" in capsys.readouterr().err
