"""Checkpoint files that fail clearly: the errors for a missing or damaged checkpoint, and the reader
the scripts use.

* Reading. fairseq's `checkpoint_utils.load_checkpoint_to_cpu` (used by fairseq-train to resume and by
  fairseq-generate/average to load) calls `torch.load`; a truncated or corrupted file surfaces as a
  zip-reader or unpickling traceback that does not say which file or what to do. Under `read_errors`
  (which patches/checkpoint_io.py puts around fairseq's loader) it becomes `CheckpointReadError` (a
  RuntimeError) naming the file, its size, the cause and the remedy. torch's safe loader refusing a
  foreign object (`Unsupported global`, see checkpoints/safety.py) is a different problem and is passed
  on unchanged.
* The scripts (scripts/convert_checkpoint.py, scripts/average_checkpoints.py) read through
  `load_file` / `require_file` here and end under `exit_on_read_error`, so a missing or damaged
  input gives the same message as fairseq-generate, as one line (exit status 1, no traceback).

Writing (no half-overwritten checkpoint_last.pt) is a fix to fairseq's own functions:
patches/checkpoint_io.py.
"""
import contextlib
import os
import pickle
import zipfile

import torch

from ..errors import Refusal


class CheckpointReadError(Refusal, RuntimeError):
    """A checkpoint cannot be read: truncated, corrupted, not a checkpoint (or, from `require_file`, missing).
    A refusal (errors.Refusal): fairseq's commands end on it with its message alone, exit status 1."""


def _describe(path: str) -> str:
    try:
        return f"{os.path.getsize(path)} bytes"
    except OSError:
        return "size unknown"


def _cause(err: BaseException) -> str:
    """The first line of what `err` says. torch's safe loader opens every unpickling failure with advice
    to retry with weights_only=False, which is wrong for a damaged file: keep what its unpickler said."""
    text = str(err).strip()
    if "WeightsUnpickler error:" in text:
        text = text.split("WeightsUnpickler error:", 1)[1].strip()
    return text.splitlines()[0] if text else type(err).__name__


def read_error(path: str, err: BaseException) -> CheckpointReadError:
    """The error raised for an unreadable checkpoint `path` (cause `err`)."""
    cause = _cause(err)
    return CheckpointReadError(
        f"cannot read checkpoint {path} ({_describe(path)}): the file is truncated or corrupted "
        f"[{type(err).__name__}: {cause}]. It may have been cut short by an interrupted write or copy, or a full disk. "
        f"Delete or move it and resume from another checkpoint (fairseq-train --restore-file "
        f"checkpoint_EPOCH_UPDATES.pt), or decode with another --path.")


_LOAD_ERRORS = (RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile, ValueError,
                KeyError, IndexError, TypeError, AttributeError, UnicodeDecodeError, OverflowError, MemoryError,
                OSError)  # a truncated zip can fail a seek with EINVAL
_NOT_CORRUPTION = (PermissionError, FileNotFoundError, IsADirectoryError)


def _is_safe_loader_refusal(err: BaseException) -> bool:
    # "Unsupported global: GLOBAL x.Y was not an allowed global" / "unsupported GLOBAL posix.system whose
    # module posix is blocked" / "Can only build Tensor, ... or types allowlisted via `add_safe_globals`,
    # but got <class 'numpy.dtypes.ObjectDType'>": torch's safe loader naming a refused object (see
    # checkpoints/safety.py)
    msg = str(err).lower()
    return isinstance(err, pickle.UnpicklingError) and ("unsupported global" in msg or "add_safe_globals" in msg)


@contextlib.contextmanager
def read_errors(path: str):
    """Turns a load error of the file `path` that means a damaged file into read_error's."""
    try:
        yield
    except _LOAD_ERRORS as e:
        if _is_safe_loader_refusal(e) or isinstance(e, _NOT_CORRUPTION) or not os.path.isfile(path):
            raise
        raise read_error(path, e) from None  # the cause is in the message; no torch internals


def require_file(path: str) -> None:
    """Raises CheckpointReadError unless `path` is a file (fairseq's own tools check this themselves)."""
    if not os.path.isfile(path):
        what = "not a file" if os.path.exists(path) else "no such file"
        raise CheckpointReadError(f"cannot read checkpoint {path}: {what}. Check the path, or list the save "
                                  f"directory for the checkpoints it holds (checkpoint_last.pt, checkpoint_best.pt, ...).")


def load_file(path: str):
    """torch.load of a local checkpoint onto the CPU with torch's default (safe) loader, as it is
    stored (without load_checkpoint_to_cpu's upgrades), raising CheckpointReadError for a missing or
    damaged file."""
    require_file(path)
    with read_errors(path):
        return torch.load(path, map_location="cpu")


@contextlib.contextmanager
def exit_on_read_error(prog: str):
    """For command-line scripts: a CheckpointReadError ends the program with `prog: message` on stderr
    and exit status 1, without a traceback (the message names the file and what to do)."""
    try:
        yield
    except CheckpointReadError as e:
        raise SystemExit(f"{prog}: {e}") from None
