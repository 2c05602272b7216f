"""End to end through fairseq's real command line: preprocess a tiny parallel corpus, train
ls_transformer_tiny for 30 updates on CPU, decode with fairseq-generate (the checkpoint is read by
torch's safe loader), score with sacrebleu, and decode the checkpoint converted to fairseq's
transformer_tiny. Marked `e2e` (select or skip with -m)."""
import os
import re

import pytest
import sacrebleu

from support.cli import USER_DIR, generate, make_data_bin, run

pytestmark = pytest.mark.e2e


def hypotheses_of(d, path):
    """{sentence id: hypothesis} of fairseq-generate on d/bin's test split."""
    return {i: hyp for i, (_, hyp) in generate(d, path)[2].items()}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("e2e"))
    make_data_bin(d, n_train=300, n_valid=20, n_test=24)  # target = the source in upper case
    _, log = run(["fairseq-train", "bin", "--user-dir", USER_DIR, "--arch", "ls_transformer_tiny",
               "--encoder-embed-dim", "32", "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
               "--decoder-ffn-embed-dim", "64", "--share-all-embeddings", "--dropout", "0.1",
               "--optimizer", "adam", "--lr", "0.01", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "5",
               "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
               "--max-tokens", "500", "--max-update", "30", "--cpu", "--seed", "1", "--num-workers", "0",
               "--save-dir", "ckpt", "--no-epoch-checkpoints", "--disable-validation",
               "--log-format", "simple", "--log-interval", "1"], d)
    losses = [float(x) for x in re.findall(r"train_inner \|.*? loss=([\d.]+)", log)]
    return d, losses


@pytest.fixture(scope="module")
def hypotheses(trained):
    """fairseq-generate on the ls_transformer checkpoint (run once for the tests below)."""
    return hypotheses_of(trained[0], "ckpt/checkpoint_last.pt")


def test_training_loss_decreases(trained):
    _, losses = trained
    assert len(losses) >= 25, losses
    first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    print(f"train loss: first 3 updates {first:.3f}, last 3 {last:.3f}")
    assert last < first - 0.3, (first, last)


def test_generate_and_sacrebleu(trained, hypotheses):
    d, _ = trained
    hyps = hypotheses
    with open(os.path.join(d, "test.tgt")) as f:
        refs = [line.strip() for line in f]
    assert len(hyps) == len(refs)
    bleu = sacrebleu.corpus_bleu([hyps[i] for i in range(len(refs))], [refs])
    assert 0.0 <= bleu.score <= 100.0
    print(f"BLEU after 30 updates: {bleu.score:.2f}")


def test_converted_checkpoint_decodes_identically_with_fairseq_transformer(trained, hypotheses):
    d, _ = trained
    from scripts import convert_checkpoint
    convert_checkpoint.main([os.path.join(d, "ckpt/checkpoint_last.pt"), os.path.join(d, "fs.pt"), "--to", "fairseq"])
    # --user-dir only for the safe-loader allowlist: the model built is fairseq's transformer_tiny
    assert hypotheses_of(d, "fs.pt") == hypotheses
