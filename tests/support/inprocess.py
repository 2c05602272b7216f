"""fairseq's command-line tools run inside the test process: `call(argv, cwd)` runs fairseq-train,
fairseq-generate, ... (or `python -m fairseq_cli.X`, a script of SCRIPTS, or `python -m M` for a
module M of SCRIPT_MODULES) as its console script would, from the same sys.argv, through the tool's
own `cli_main` (a script or script module: as `__main__`) and its own parser, and returns (exit
status, output) as a subprocess would give them. A fairseq process costs seconds of
start-up (torch, fairseq, the plugin); an in-process call costs the run alone.

What the process would have and the test process lacks or shares, set for the call and restored after:
the working directory, sys.argv (fairseq's parser and the plugin's cli_config read it), the
environment (torch's TORCH_FORCE_* loader switches removed, as `support.cli.env` does for a
subprocess), one torch thread (OMP_NUM_THREADS=1), warnings ignored (PYTHONWARNINGS=ignore), the
global random states (fairseq seeds torch, numpy and random), the root logger (fairseq's format at
INFO, into the captured output) and logging's global switch-off (`logging.disable`, which the
benchmark sets to quiet fairseq), the best validation score fairseq keeps on its functions, and
fairseq's data-buffer threads (stopped after the call, as the plugin's exit hook stops them at a
process's exit), torch.distributed's default process group (one the call leaves initialised, e.g. the
fake group of bench_sequence_parallel's grid, is destroyed: a fresh process has none) and sys.excepthook
(a fresh process's, the plugin's: a process group initialised in the test process wraps it).

Not for what only a process shows: a run without --user-dir (the plugin, once imported, patches
fairseq for the whole test process), exit at interpreter shutdown, signals, several ranks, torchrun.
`IN_PROCESS` names the tools that may be called here; `support.cli.run` decides."""
import contextlib
import importlib
import io
import logging
import os
import random
import runpy
import sys
import warnings

import numpy as np
import torch

from fairseq_lightseq.patches import refusal_exit

# console script -> the module whose cli_main it calls
IN_PROCESS = {"fairseq-train": "fairseq_cli.train", "fairseq-generate": "fairseq_cli.generate",
              "fairseq-preprocess": "fairseq_cli.preprocess", "fairseq-eval-lm": "fairseq_cli.eval_lm",
              "fairseq-validate": "fairseq_cli.validate"}
# the repository's scripts that import the plugin themselves (so that a process of theirs has it too)
SCRIPTS = ("convert_checkpoint.py", "average_checkpoints.py")
# modules run as `python -m M` whose own process is no part of what they do: the benchmarks' parents
# (they prepare the data and start one child process per side and round themselves), the export,
# bench_sequence_parallel's grid (one process faking a world of P ranks; its --gloo runs start processes)
SCRIPT_MODULES = ("scripts.benchmark", "scripts.bench_generate", "scripts.bench_sequence_parallel",
                  "fairseq_lightseq.export_ctranslate2")
LOG_FORMAT = "%(asctime)s | %(levelname)s | %(name)s | %(message)s"  # fairseq_cli's basicConfig


def entry_point(cmd):
    """(module, argv) when `cmd` is a fairseq tool (console script name or path, or `python -m
    fairseq_cli.X`), `python SCRIPT` of SCRIPTS or `python -m M` of SCRIPT_MODULES; module is None for
    a script. None otherwise."""
    name = os.path.basename(cmd[0])
    if name in IN_PROCESS:
        return IN_PROCESS[name], [name, *cmd[1:]]
    if cmd[0] == sys.executable and len(cmd) > 1:
        if cmd[1] == "-m" and len(cmd) > 2 and (cmd[2] in IN_PROCESS.values() or cmd[2] in SCRIPT_MODULES):
            return cmd[2], [cmd[2], *cmd[3:]]
        if os.path.basename(cmd[1]) in SCRIPTS:
            return None, cmd[1:]
    return None


def _forget_best():
    """fairseq keeps a run's best validation score on functions (`save_checkpoint.best`, which decides
    checkpoint_best.pt; `should_stop_early.best` and `.num_runs`, --patience): a fresh process has none."""
    from fairseq import checkpoint_utils

    train = sys.modules.get("fairseq_cli.train")
    for fn in (checkpoint_utils.save_checkpoint, getattr(train, "should_stop_early", None)):
        while fn is not None:  # the plugin's wrapper and the function it wraps
            for attr in ("best", "num_runs"):
                fn.__dict__.pop(attr, None)
            fn = getattr(fn, "__wrapped__", None)


@contextlib.contextmanager
def _process_state(argv, cwd, extra_env):
    """What a fresh process would have, for the duration of the call; the test process's afterwards."""
    saved_cwd, saved_argv, saved_env, saved_path = os.getcwd(), sys.argv, dict(os.environ), sys.path[:]
    threads = torch.get_num_threads()
    rng = torch.get_rng_state(), np.random.get_state(), random.getstate()
    root = logging.getLogger()
    handlers, level, disabled = root.handlers[:], root.level, logging.root.manager.disable
    had_group = torch.distributed.is_available() and torch.distributed.is_initialized()
    hook = sys.excepthook  # torch.distributed's init_process_group wraps it (a "[rankR]: " prefix per line)
    try:
        sys.excepthook = refusal_exit.excepthook  # a fresh process's, with the plugin
        _forget_best()
        os.chdir(cwd)
        sys.argv = list(argv)
        if argv[0].endswith(".py"):  # a script's own directory comes first on its path
            sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
        for k in [k for k in os.environ if k.startswith("TORCH_FORCE_")]:
            del os.environ[k]
        os.environ.update(extra_env)
        torch.set_num_threads(1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        os.chdir(saved_cwd)
        sys.argv = saved_argv
        sys.excepthook = hook
        sys.path[:] = saved_path
        os.environ.clear()
        os.environ.update(saved_env)
        torch.set_num_threads(threads)
        torch.set_rng_state(rng[0])
        np.random.set_state(rng[1])
        random.setstate(rng[2])
        root.handlers[:] = handlers
        root.setLevel(level)
        logging.disable(disabled)
        if not had_group and torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        _forget_best()


def call(cmd, cwd, **extra_env):
    """Runs `cmd` (see `entry_point`) in this process in directory `cwd`; returns (exit status, stdout
    and stderr as one text). An exception escaping the tool is printed as Python prints it at exit, by
    sys.excepthook (a traceback, last line `module.Error: message`; the plugin's refusals: `PROG: error:
    message` alone, patches/refusal_exit.py) and gives status 1; SystemExit gives its code."""
    rc, out, _ = _call(cmd, cwd, extra_env, split=False)
    return rc, out


def call_split(cmd, cwd, **extra_env):
    """`call` with stdout and stderr kept apart (the log, fairseq's included, is stderr's): returns
    (exit status, stdout, stderr)."""
    return _call(cmd, cwd, extra_env, split=True)


def _call(cmd, cwd, extra_env, split):
    module, argv = entry_point(cmd)
    buf = io.StringIO()
    err = io.StringIO() if split else buf
    handler = logging.StreamHandler(err)
    handler.setFormatter(logging.Formatter(LOG_FORMAT, datefmt="%Y-%m-%d %H:%M:%S"))
    with _process_state(argv, str(cwd), extra_env), contextlib.redirect_stdout(buf), contextlib.redirect_stderr(err):
        root = logging.getLogger()
        root.handlers[:] = [handler]
        root.setLevel(logging.INFO)
        try:
            if module is None:
                runpy.run_path(argv[0], run_name="__main__")
            elif module in SCRIPT_MODULES:
                runpy.run_module(module, run_name="__main__", alter_sys=True)
            else:
                importlib.import_module(module).cli_main()
            rc = 0
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if not isinstance(e.code, (int, type(None))):
                print(e.code, file=sys.stderr)
        except Exception:  # noqa: BLE001  (what the interpreter would print, by sys.excepthook, and exit 1 on)
            sys.excepthook(*sys.exc_info())
            rc = 1
        finally:
            from fairseq_lightseq.patches.clean_exit import stop_data_buffer_threads

            stop_data_buffer_threads()
    return rc, buf.getvalue(), err.getvalue()


def train_losses(argv, cwd):
    """Runs `fairseq-train argv` through `call` and returns the loss of each update unrounded (fairseq's
    log rounds it to 3 decimals): the `train_inner` loss meter's average right after each update, the
    value fairseq logs with --log-interval 1. A run that fails raises with its output."""
    if "--log-interval" not in argv or argv[argv.index("--log-interval") + 1] != "1":
        raise ValueError("train_losses reads the per-update meter: pass --log-interval 1")
    from fairseq.logging import metrics
    from fairseq.trainer import Trainer

    losses = []
    train_step = Trainer.train_step

    def recorded(self, samples, raise_oom=False):
        out = train_step(self, samples, raise_oom)
        losses.append(float(metrics.get_meter("train_inner", "loss").avg))
        return out

    Trainer.train_step = recorded
    try:
        rc, output = call(["fairseq-train", *argv], cwd)
    finally:
        Trainer.train_step = train_step
    if rc != 0:
        raise RuntimeError(f"fairseq-train exited {rc}:\n{output[-4000:]}")
    return losses
