"""The WMT14 En-De recipe (examples/wmt14_en_de) end to end on a small local corpus, so the scripts
cannot rot: prepare.sh from raw files (sentencepiece, cleaning, fairseq-preprocess) -> train.sh
(ls and native variants, a tiny model on CPU through the pass-through arguments) -> evaluate.sh
(average the last checkpoints, fairseq-generate with beam 4, detokenised and compound-split BLEU).
Marked `e2e`. The `prepared`/`train` helpers live in tests/support/recipe.py."""
import os
import re
import sys

import pytest
import torch

from support.recipe import N_TEST, N_TRAIN, N_VALID, RECIPE, prepare_once, run, train, train_inner

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="session")
def prepared(tmp_path_factory):
    return prepare_once(tmp_path_factory)


@pytest.fixture(scope="module")
def trained(prepared):
    d, _ = prepared
    _, log = train(d, "ckpt", "--max-update", "6", "--save-interval-updates", "2", "--keep-interval-updates", "3")
    return d, log


def count_lines(path):
    with open(path, encoding="utf-8") as f:
        return sum(1 for _ in f)


def test_prepare_outputs(prepared):
    d, log = prepared
    out = os.path.join(d, "out")
    for name in ("dict.en.txt", "dict.de.txt", "train.en-de.en.bin", "valid.en-de.de.idx", "test.en-de.en.bin"):
        assert os.path.isfile(os.path.join(out, "data-bin", name)), name
    assert open(os.path.join(out, "data-bin", "dict.en.txt")).read() == open(os.path.join(out, "data-bin", "dict.de.txt")).read()
    # valid/test are never filtered (they must stay aligned with the raw references); train may be
    assert count_lines(os.path.join(out, "spm", "test.de")) == N_TEST
    assert count_lines(os.path.join(out, "spm", "valid.en")) == N_VALID
    kept = count_lines(os.path.join(out, "spm", "train.en"))
    assert 0.9 * N_TRAIN <= kept <= N_TRAIN and kept == count_lines(os.path.join(out, "spm", "train.de"))
    assert "\u2581" in open(os.path.join(out, "spm", "train.de"), encoding="utf-8").readline()  # pieces
    assert os.path.isfile(os.path.join(out, "spm", "spm.model"))


def test_prepare_rejects_misaligned_input(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    for split in ("train", "valid", "test"):
        (raw / f"{split}.en").write_text("a b\nc d\n")
        (raw / f"{split}.de").write_text("a b\n" if split == "valid" else "a b\nc d\n")
    rc, out = run([os.path.join(RECIPE, "prepare.sh"), "raw", "out"], cwd=str(tmp_path), check=False)
    assert rc != 0 and "valid.en has 2 lines" in out, out[-2000:]


def test_train_ls(trained):
    d, log = trained
    records = train_inner(log)
    assert [int(r["num_updates"]) for r in records] == list(range(1, 7))
    assert "--arch ls_transformer_vaswani_wmt_en_de_big" in log and "ls_adam" in log
    assert "LSTransformerModel" in log or "ls_transformer" in log
    ckpts = sorted(f for f in os.listdir(os.path.join(d, "ckpt")) if f.startswith("checkpoint"))
    assert ckpts == ["checkpoint_1_2.pt", "checkpoint_1_4.pt", "checkpoint_1_6.pt", "checkpoint_last.pt"]


def test_train_native(prepared):
    d, _ = prepared
    _, log = train(d, "ckpt-native", "--max-update", "2", variant="native")
    assert "--arch transformer_vaswani_wmt_en_de_big" in log
    assert [int(r["num_updates"]) for r in train_inner(log)] == [1, 2]


def test_train_bf16(prepared):
    """PRECISION=bf16: the recipe passes --bf16 and fairseq-train trains in bfloat16 on the CPU."""
    d, _ = prepared
    _, log = train(d, "ckpt-bf16", "--max-update", "3", env={"PRECISION": "bf16"})
    assert "--bf16" in log and "training in bfloat16 on CPU" in log, log[-3000:]
    records = train_inner(log)
    assert [int(r["num_updates"]) for r in records] == [1, 2, 3]
    assert all(float(r["loss"]) == float(r["loss"]) for r in records)


def test_train_torchrun_two_processes(prepared):
    """TORCHRUN set: torchrun starts the ranks (here 2 CPU processes over gloo, as on each machine of
    a multi-node run); fairseq reads their rank and world size from torchrun."""
    import socket

    d, _ = prepared
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    _, log = train(d, "ckpt-torchrun", "--max-update", "3", "--distributed-backend", "gloo",
                   env={"TORCHRUN": f"--nproc_per_node 2 --master_addr 127.0.0.1 --master_port {port}"})
    assert "torch.distributed.run --nproc_per_node 2" in log
    assert "distributed init (rank 0): env://" in log and "distributed init (rank 1): env://" in log, log[-3000:]
    assert [int(r["num_updates"]) for r in train_inner(log)] == [1, 2, 3]


def test_train_rejects_unknown_variant(prepared):
    d, _ = prepared
    rc, out = train(d, "ckpt-x", variant="lightseq", check=False)
    assert rc == 2 and "ls or native" in out


def test_evaluate(trained):
    d, _ = trained
    ckpt = os.path.join(d, "ckpt")
    rc, out = run([os.path.join(RECIPE, "evaluate.sh"), "out/data-bin", "ckpt", "raw/test.de", "out/spm/spm.model",
                   "--cpu", "--num-workers", "0", "--max-len-a", "1", "--max-len-b", "5"], cwd=d,
                  env={"NUM_CHECKPOINTS": "3"})
    detok = re.search(r"detokenized sacreBLEU: ([\d.]+) .*signature nrefs:1\|case:mixed\|eff:no\|tok:13a", out)
    split = re.search(r"tokenized compound-split BLEU: ([\d.]+)", out)
    assert detok and split, out[-3000:]
    assert 0 <= float(detok.group(1)) <= 100 and 0 <= float(split.group(1)) <= 100
    assert "--beam 4 --lenpen 0.6" in open(os.path.join(ckpt, "generate-test.txt")).read() or "beam=4" in out
    assert count_lines(os.path.join(ckpt, "test.hyp")) == N_TEST

    # the decoded checkpoint is the mean of the last three
    from fairseq import checkpoint_utils

    avg = checkpoint_utils.load_checkpoint_to_cpu(os.path.join(ckpt, "checkpoint_avg3.pt"))["model"]
    models = [checkpoint_utils.load_checkpoint_to_cpu(os.path.join(ckpt, f"checkpoint_1_{u}.pt"))["model"]
              for u in (2, 4, 6)]
    for k, v in avg.items():
        if v.is_floating_point():
            torch.testing.assert_close(v, sum(m[k].double() for m in models).div(3).to(v.dtype), rtol=0, atol=0)


def test_evaluate_rejects_other_spm_model(trained, tmp_path):
    import sentencepiece as spm

    d, _ = trained
    (tmp_path / "t.txt").write_text("\n".join(f"zz{i} qq{i}" for i in range(200)))
    spm.SentencePieceTrainer.train(input=str(tmp_path / "t.txt"), model_prefix=str(tmp_path / "other"),
                                   vocab_size=60, hard_vocab_limit=False, minloglevel=2)
    rc, out = run([os.path.join(RECIPE, "evaluate.sh"), "out/data-bin", "ckpt", "raw/test.de",
                   str(tmp_path / "other.model"), "--cpu"], cwd=d, check=False)
    assert rc != 0 and "different preparations" in out, out[-2000:]


def test_score_compound_split():
    sys.path.insert(0, RECIPE)
    try:
        import score
    finally:
        sys.path.remove(RECIPE)
    assert score.compound_split("die Mehrwertsteuer-Erhöhung , 2-3 - x") == \
        "die Mehrwertsteuer ##AT##-##AT## Erhöhung , 2 ##AT##-##AT## 3 - x"
