"""fairseq-train with an out-of-range probability stops before training, exits 1 (not 134) and
names the option: --dropout and --attention-dropout at model build, --label-smoothing at criterion
build. A subprocess each: the exit status is what is tested."""
import pytest

from support.cli import LS, corpus_once, train

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("flag,value,message", [
    ("--dropout", "-0.1", "--dropout must be in [0, 1], got -0.1"),
    ("--attention-dropout", "1.5", "--attention-dropout must be in [0, 1], got 1.5"),
    ("--label-smoothing", "1.5", "--label-smoothing must be in [0, 1), got 1.5"),
])
def test_out_of_range_option_refused_before_training(tmp_path_factory, flag, value, message):
    d = corpus_once(tmp_path_factory)
    rc, out = train(d, *LS, "--lr", "5e-4", "--max-tokens", "2000", "--max-update", "2", "--no-save",
                    "--disable-validation", flag, value, check=False, process=True)
    assert rc == 1, f"exit {rc}\n{out[-3000:]}"
    assert message in out
    assert "Start iterating over samples" not in out and "terminate called" not in out
