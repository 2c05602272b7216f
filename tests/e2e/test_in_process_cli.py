"""support.inprocess, which runs most fairseq commands of the e2e tests inside the test process: a
call gives the exit status and output a fairseq process would (argparse's exit 2 and message, a
traceback ending in `module.Error: message` and 1), and leaves the test process as it found it
(working directory, sys.argv, environment, torch threads, random states, root logger, logging's
switch-off, sys.path), also after a script module run as `__main__`. Marked `e2e`."""
import logging
import os
import random
import sys

import numpy as np
import pytest
import torch

from support import ROOT
from support.cli import USER_DIR
from support.inprocess import call

pytestmark = pytest.mark.e2e


def _state():
    root = logging.getLogger()
    return (os.getcwd(), list(sys.argv), dict(os.environ), torch.get_num_threads(), torch.get_rng_state(),
            np.random.get_state()[1].copy(), random.getstate(), list(root.handlers), root.level,
            logging.root.manager.disable, list(sys.path))


def _assert_same(a, b):
    assert a[:4] == b[:4] and a[6:] == b[6:]
    assert torch.equal(a[4], b[4]) and np.array_equal(a[5], b[5])


def test_argparse_error_exits_2_with_the_message(tmp_path):
    before = _state()
    rc, out = call(["fairseq-train", str(tmp_path), "--user-dir", USER_DIR, "--arch", "no_such_arch"], tmp_path,
                   TORCH_FORCE_WEIGHTS_ONLY_LOAD="1")
    assert rc == 2 and "argument --arch/-a: invalid choice: 'no_such_arch'" in out, out[-2000:]
    _assert_same(_state(), before)


def test_exception_is_printed_as_at_exit_and_exits_1(tmp_path):
    before = _state()
    rc, out = call(["fairseq-train", str(tmp_path / "missing"), "--user-dir", USER_DIR, "--arch", "ls_transformer",
                    "--cpu", "--max-tokens", "100", "--seed", "5"], tmp_path)
    last = out.strip().splitlines()[-1]
    assert rc == 1 and "Traceback (most recent call last)" in out and last.startswith("FileNotFoundError: "), last
    assert "| INFO | fairseq_cli.train |" in out  # fairseq's log format, captured
    _assert_same(_state(), before)


def test_script_module_runs_as_main_and_its_logging_switch_off_is_undone(tmp_path):
    """The benchmark's parent switches fairseq's logging off (logging.disable) and puts the measured tree
    on sys.path before it refuses a --host-overhead run without a baseline (SystemExit with a message)."""
    before = _state()
    rc, out = call([sys.executable, "-m", "scripts.benchmark", "--host-overhead", "--sides", "ls", "--cache-dir",
                    str(tmp_path)], ROOT)
    assert rc == 1 and "--sides must name ls and fairseq" in out, out[-2000:]
    _assert_same(_state(), before)
