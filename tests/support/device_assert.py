"""Runs code that ends in a device assert of our CUDA kernels (a bad target or token id that the kernel checks,
because a host check would sync the device on every call), on a GPU or on the emulated CUDA device.

`run(code, device)` -> (failed, output): whether `code` raised, and everything it printed (the kernel's own
line included). `code` sees `torch`, `_backend` (fairseq_lightseq.ops._backend) and `DEVICE`. On a GPU it runs
in a child process: a device assert leaves the process's CUDA context unusable. On the emulated device
(device "cpu", from a test marked cuda_emulated) it runs in this process: there an assert fails its launch
alone, and a child process would cost seconds of start-up per case."""
import ctypes
import os
import subprocess
import sys
import tempfile

from . import ROOT

PRELUDE = """
import torch
from fairseq_lightseq.ops import _backend
DEVICE = {device!r}
"""


def run(code: str, device: str):
    source = PRELUDE.format(device=device) + code
    if device == "cuda":
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
        r = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True, timeout=300, env=env)
        return r.returncode != 0, r.stdout + r.stderr
    libc = ctypes.CDLL(None)
    failed, message = False, ""
    with tempfile.TemporaryFile(mode="w+") as f:  # the kernel prints through C's stdout/stderr: the fds
        saved = [os.dup(1), os.dup(2)]
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
        try:
            exec(compile(source, "<device assert>", "exec"), {})
        except RuntimeError as e:
            failed, message = True, str(e)
        finally:
            libc.fflush(None)
            for fd, old in ((1, saved[0]), (2, saved[1])):
                os.dup2(old, fd)
                os.close(old)
        f.seek(0)
        return failed, f.read() + message
