"""Checkpoint files that fail clearly and are never half-overwritten.

What fairseq (0.12.3.1) already does, and what this module adds (installed on import, i.e. by
`--user-dir fairseq_lightseq`; it only wraps functions of `fairseq.checkpoint_utils`):

* Writing. `checkpoint_utils.torch_persistent_save` writes `NAME.tmp` and renames it over `NAME`,
  so a failed `torch.save` (disk full, killed process) leaves the previous `NAME` intact. Two gaps:
  the failed `NAME.tmp` stays behind (we delete it), and `save_checkpoint` then *copies* the first
  file to the others (`checkpoint_last.pt`, `checkpoint_best.pt`) with `shutil.copyfile` straight
  onto the destination, so a copy that fails midway truncates the previous `checkpoint_last.pt`.
  We make that copy atomic too (copy to `DST.tmp`, then `os.replace`).
* Reading. `checkpoint_utils.load_checkpoint_to_cpu` (used by fairseq-train to resume and by
  fairseq-generate/average to load) calls `torch.load`; a truncated or corrupted file surfaces as
  a zip-reader or unpickling traceback that does not say which file or what to do. We raise
  `CheckpointReadError` (a RuntimeError) naming the file, its size, the cause and the remedy.
  torch's safe loader refusing a foreign object (`Unsupported global`, see checkpoint_safety) is
  a different problem and is passed on unchanged.
* The scripts (scripts/convert_checkpoint.py, scripts/average_checkpoints.py) read through
  `load_file` / `require_file` here and end under `exit_on_read_error`, so a missing or damaged
  input gives the same message as fairseq-generate, as one line (exit status 1, no traceback).
"""
import contextlib
import os
import pickle
import shutil
import zipfile

import torch
from fairseq import checkpoint_utils
from fairseq.file_io import PathManager


class CheckpointReadError(RuntimeError):
    """A checkpoint cannot be read: truncated, corrupted, not a checkpoint (or, from `require_file`, missing)."""


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
    # checkpoint_safety)
    msg = str(err).lower()
    return isinstance(err, pickle.UnpicklingError) and ("unsupported global" in msg or "add_safe_globals" in msg)


@contextlib.contextmanager
def _read_errors(path: str):
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
    with _read_errors(path):
        return torch.load(path, map_location="cpu")


@contextlib.contextmanager
def exit_on_read_error(prog: str):
    """For command-line scripts: a CheckpointReadError ends the program with `prog: message` on stderr
    and exit status 1, without a traceback (the message names the file and what to do)."""
    try:
        yield
    except CheckpointReadError as e:
        raise SystemExit(f"{prog}: {e}") from None


def _wrap_load(load):
    def load_checkpoint_to_cpu(path, arg_overrides=None, load_on_all_ranks=False):
        with _read_errors(path):
            return load(path, arg_overrides, load_on_all_ranks)
    load_checkpoint_to_cpu.__doc__ = load.__doc__
    load_checkpoint_to_cpu._fls_wrapped = load
    return load_checkpoint_to_cpu


def _wrap_save(save):
    def torch_persistent_save(obj, filename, async_write: bool = False):
        try:
            return save(obj, filename, async_write)
        except BaseException:
            if isinstance(filename, str) and os.path.exists(filename + ".tmp"):
                try:
                    os.remove(filename + ".tmp")  # the previous `filename` was not touched
                except OSError:
                    pass
            raise
    torch_persistent_save.__doc__ = save.__doc__
    torch_persistent_save._fls_wrapped = save
    return torch_persistent_save


class AtomicCopyPathManager(PathManager):
    """fairseq's PathManager whose `copy` of a local file never leaves a partial destination."""

    @staticmethod
    def copy(src_path: str, dst_path: str, overwrite: bool = False) -> bool:
        if PathManager.path_requires_pathmanager(src_path) or PathManager.path_requires_pathmanager(dst_path):
            return PathManager.copy(src_path, dst_path, overwrite)
        if not overwrite and os.path.exists(dst_path):
            return False
        tmp = dst_path + ".tmp"
        try:
            shutil.copyfile(src_path, tmp)
            os.replace(tmp, dst_path)
        except BaseException:
            if os.path.exists(tmp):
                os.remove(tmp)
            raise
        return True


def install() -> None:
    """Wraps fairseq.checkpoint_utils' load/save and its copy (idempotent)."""
    if not hasattr(checkpoint_utils.load_checkpoint_to_cpu, "_fls_wrapped"):
        checkpoint_utils.load_checkpoint_to_cpu = _wrap_load(checkpoint_utils.load_checkpoint_to_cpu)
    if not hasattr(checkpoint_utils.torch_persistent_save, "_fls_wrapped"):
        checkpoint_utils.torch_persistent_save = _wrap_save(checkpoint_utils.torch_persistent_save)
    checkpoint_utils.PathManager = AtomicCopyPathManager


install()
