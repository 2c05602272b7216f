"""Checkpoint files that fail clearly and are never half-overwritten: fairseq's checkpoint functions
wrapped (installed by `patches.install()`; only functions of `fairseq.checkpoint_utils` are replaced).

What fairseq (0.12.3.1) already does, and what this adds:

* Writing. `checkpoint_utils.torch_persistent_save` writes `NAME.tmp` and renames it over `NAME`,
  so a failed `torch.save` (disk full, killed process) leaves the previous `NAME` intact. Two gaps:
  the failed `NAME.tmp` stays behind (we delete it), and `save_checkpoint` then *copies* the first
  file to the others (`checkpoint_last.pt`, `checkpoint_best.pt`) with `shutil.copyfile` straight
  onto the destination, so a copy that fails midway truncates the previous `checkpoint_last.pt`.
  We make that copy atomic too (copy to `DST.tmp`, then `os.replace`).
* Reading. `checkpoint_utils.load_checkpoint_to_cpu` runs under checkpoints.io.read_errors: a
  truncated or corrupted file raises CheckpointReadError naming the file and the remedy.
"""
import os
import shutil

from fairseq import checkpoint_utils
from fairseq.file_io import PathManager

from ..checkpoints.io import read_errors
from .wrap import replace, wrap


def _wrap_load(load):
    def load_checkpoint_to_cpu(path, arg_overrides=None, load_on_all_ranks=False):
        with read_errors(path):
            return load(path, arg_overrides, load_on_all_ranks)
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
    wrap(checkpoint_utils, "load_checkpoint_to_cpu", _wrap_load)
    wrap(checkpoint_utils, "torch_persistent_save", _wrap_save)
    replace(checkpoint_utils, "PathManager", AtomicCopyPathManager)
