"""A fairseq run that succeeded exits 0, every time (fairseq_lightseq.patches.clean_exit). Each run is
its own process: the exit is what is tested.

fairseq's data-buffer thread (a daemon BackgroundConsumer) still collating a batch when Python
finalises aborts the process with "terminate called without an active exception" (exit 134).
`--max-valid-steps 0` with a validation set of 12 batches of 500 sentences leaves it collating on
every run: without the plugin's exit hook fairseq-train aborts there every time (native fairseq
too); a plain short run (--disable-validation, --max-update 5, ending in epoch 3) hits it by timing.
"""
import pytest

from support.cli import LS, NATIVE, generate, make_corpus, train

pytestmark = pytest.mark.e2e

COMMON = ["--lr", "5e-4", "--max-tokens", "2000"]
# Stops validation after its first batch, with 11 more to collate (buffer 10): the thread is busy.
BUSY_BUFFER = ["--max-update", "1", "--batch-size-valid", "500", "--max-valid-steps", "0"]
SHORT_RUN = ["--no-save", "--disable-validation", "--max-update", "5"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(str(tmp_path_factory.mktemp("clean_exit")), n_valid=6000)


def test_consecutive_runs_exit_0(corpus):
    """Each busy-buffer command once (it aborts on every run without the hook, so a repeat adds
    nothing), the short run once per model, and fairseq-generate on the saved checkpoint once
    (its one-batch test set is read to the end: no thread is left collating)."""
    d = corpus
    def fairseq_train(*args):
        return train(d, *args, check=False, process=True)

    runs = [
        ("ls, busy buffer, save", lambda: fairseq_train(*LS, *COMMON, *BUSY_BUFFER, "--save-dir", "ckpt",
                                                        "--no-epoch-checkpoints")),
        ("short run, transformer", lambda: fairseq_train(*NATIVE, *COMMON, *SHORT_RUN)),
        ("short run, ls", lambda: fairseq_train(*LS, *COMMON, *SHORT_RUN)),
        ("transformer, busy buffer", lambda: fairseq_train(*NATIVE, *COMMON, *BUSY_BUFFER, "--no-save")),
        ("ls, busy buffer", lambda: fairseq_train(*LS, *COMMON, *BUSY_BUFFER, "--no-save")),
        ("generate", lambda: generate(d, "ckpt/checkpoint_last.pt", check=False, process=True)[:2]),
    ]
    failures = []
    for name, fn in runs:
        rc, out = fn()
        done = "done training" in out or "Generate test with beam=2" in out
        if rc != 0 or not done or "terminate called" in out:
            failures.append(f"{name}: exit {rc}\n{out[-1500:]}")
    assert not failures, f"{len(failures)} of {len(runs)} runs failed:\n" + "\n".join(failures)
