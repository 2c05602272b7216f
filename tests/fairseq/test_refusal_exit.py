"""patches/refusal_exit.py: which exceptions the exception hook ends with their message alone (the plugin's
refusals, raised in this process or in a rank that torch.multiprocessing.spawn started, as fairseq's own
spawn does on GPUs) and that every other exception still gets Python's traceback. The commands
themselves: tests/e2e/test_refusal_exit_cli.py."""
import contextlib
import io
import sys
import traceback

import pytest
from torch.multiprocessing import ProcessRaisedException

from fairseq_lightseq.checkpoints.io import CheckpointReadError
from fairseq_lightseq.errors import ConfigurationError
from fairseq_lightseq.patches import refusal_exit
from fairseq_lightseq.patches.refusal_exit import refusal_message


def raised(error: BaseException) -> BaseException:
    try:
        raise error
    except BaseException as e:  # noqa: BLE001
        return e


def from_a_spawned_rank(error: BaseException) -> ProcessRaisedException:
    """The exception the parent of torch.multiprocessing.spawn raises when a rank raised `error`: the rank's
    traceback as text (torch.multiprocessing.spawn: _wrap writes traceback.format_exc(), ProcessContext.join
    reads it into the message)."""
    try:
        raise error
    except BaseException:  # noqa: BLE001
        trace = traceback.format_exc()
    return ProcessRaisedException(f"\n\n-- Process 1 terminated with the following error:\n{trace}", 1, 4242)


@pytest.mark.parametrize("error", [ConfigurationError("ls_transformer: --x 1 is refused"),
                                   CheckpointReadError("cannot read checkpoint a.pt (12 bytes): truncated")])
def test_a_refusal_gives_its_message_here_and_from_a_spawned_rank(error):
    assert refusal_message(raised(error)) == str(error)
    assert refusal_message(from_a_spawned_rank(error)) == str(error)


def test_a_refusal_that_fairseq_re_raised_as_its_own_exception_gives_its_message():
    """fairseq's trainer.load_checkpoint re-raises whatever the model's load_state_dict raised as
    Exception("Cannot load model parameters from checkpoint ..."): the refusal is its context."""
    refusal = ConfigurationError("ls_bart: the checkpoint's weights are a decoder-only model's")
    try:
        try:
            raise refusal
        except Exception:
            raise Exception("Cannot load model parameters from checkpoint c.pt; please ensure that the "
                            "architectures match.")
    except Exception as wrapped:  # noqa: BLE001
        assert refusal_message(wrapped) == str(refusal)


@pytest.mark.parametrize("error", [ValueError("ls_transformer: not ours"), RuntimeError("x: y"), KeyError("k")])
def test_other_exceptions_are_not_refusals(error):
    assert refusal_message(raised(error)) is None
    assert refusal_message(from_a_spawned_rank(error)) is None


def hook_output(error: BaseException, argv0: str = "/venv/bin/fairseq-train") -> str:
    """What the plugin's exception hook writes on stderr for `error` when the program is `argv0` (called
    directly: a process group that other tests initialised in this process wraps sys.excepthook)."""
    err = io.StringIO()
    saved = sys.argv
    sys.argv = [argv0]
    try:
        with contextlib.redirect_stderr(err):
            e = raised(error)
            refusal_exit.excepthook(type(e), e, e.__traceback__)
    finally:
        sys.argv = saved
    return err.getvalue()


def test_the_hook_writes_one_line_for_a_refusal():
    out = hook_output(ConfigurationError("ls_roberta: --y is refused"))
    assert out == "fairseq-train: error: ls_roberta: --y is refused\n"


def test_the_hook_leaves_other_exceptions_to_the_previous_hook():
    out = hook_output(ValueError("something else"))
    assert "Traceback (most recent call last)" in out and out.strip().splitlines()[-1] == "ValueError: something else"
