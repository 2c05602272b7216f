"""The benchmarks' fresh processes: every timed run (one side, one round) runs in a process of its own,
so that no side inherits another's allocator, autograd, compile or profiler state.

    run("scripts.benchmark:child", spec, repo, threads, fork=device == "cpu") -> the child's result (a dict)

"MODULE:FUNCTION" names the child's work, FUNCTION(spec) -> a JSON-serialisable dict; MODULE's command
line hands `--_child JSON` to `serve(FUNCTION, JSON)`. `repo` is the checkout whose fairseq_lightseq
the child imports (use_tree).

Two ways to start the child, the same state when FUNCTION begins (no model built, no tensor allocated, no
thread pool started):
- a new interpreter, `python -m MODULE --_child JSON` (CUDA, and whenever fork is False): a CUDA context
  cannot cross a fork, so a GPU run never forks;
- fork=True: a fork of one server process (started on first use, one per caller, ended when the caller
  exits) that imported torch, torch._dynamo and fairseq once; fairseq_lightseq is not preloaded, each
  child imports it from its repo. A new interpreter spends 4-6 s importing these before the first step;
  a fork skips that. The child gets the caller's environment as of the call and its working directory;
  its output goes to a log file that a failure shows. Thread counts: the server starts without
  OMP_NUM_THREADS/MKL_NUM_THREADS (torch's defaults, as a new interpreter without them has), and a child
  whose environment sets OMP_NUM_THREADS sets torch's count to it (its OpenMP read the server's
  environment when torch loaded, so the variable alone would not act).
"""
import argparse
import atexit
import importlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import traceback

from scripts.bench_support import check_args

SCRIPTS_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # holds scripts/
PRELOAD = ["torch", "torch._dynamo", "fairseq", "fairseq.options", "fairseq_cli.train"]
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
_server = None


def _env(threads) -> dict:
    """The child's environment: the caller's, with warnings off, this checkout importable (its scripts
    package) and, given `threads`, OMP_NUM_THREADS."""
    env = dict(os.environ, PYTHONWARNINGS="ignore", PYTHONPATH=os.pathsep.join(
        [SCRIPTS_ROOT, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def run(entry: str, spec: dict, repo: str, threads=None, fork: bool = False) -> dict:
    """Runs entry "MODULE:FUNCTION" on spec in a fresh process (see the module docstring); returns its
    result. Raises RuntimeError with the child's output when it fails."""
    module = entry.split(":")[0]
    spec = dict(spec, repo=repo)
    env = _env(threads)
    what = f"{module} child ({' '.join(spec.get('args', []))})"
    if not fork:
        r = subprocess.run([sys.executable, "-m", module, "--_child", json.dumps(spec)],
                           capture_output=True, text=True, env=env)
        for line in r.stdout.splitlines():
            if line.startswith("RESULT "):
                return json.loads(line[7:])
        raise RuntimeError(f"{what} failed:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
    with tempfile.TemporaryDirectory(prefix="fls_child_") as tmp:
        log, out = os.path.join(tmp, "log"), os.path.join(tmp, "result.json")
        code = _fork({"entry": entry, "spec": spec, "env": env, "cwd": os.getcwd(), "log": log, "out": out})
        if code == 0 and os.path.exists(out):
            with open(out) as f:
                return json.load(f)
        with open(log, errors="replace") as f:
            text = f.read()
        raise RuntimeError(f"{what} failed (exit {code}):\n{text[-6000:]}")


def _fork(request: dict) -> int:
    """Has the fork server (started on first use) run one child; returns the child's exit status."""
    global _server
    if _server is None or _server.poll() is not None:
        env = {k: v for k, v in _env(None).items() if k not in THREAD_VARS}
        _server = subprocess.Popen([sys.executable, "-m", "scripts.bench_support.children"], env=env,
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        atexit.register(_server.stdin.close)  # the server ends at EOF
    _server.stdin.write(json.dumps(request) + "\n")
    _server.stdin.flush()
    answer = _server.stdout.readline()
    if not answer:
        raise RuntimeError(f"the benchmark fork server ended (exit {_server.wait()})")
    return int(answer)


def add_args(p) -> None:
    """The options of a script that runs children: --repo (the tree benchmarked) and the hidden --_child."""
    p.add_argument("--repo", default=SCRIPTS_ROOT, help="the checkout whose fairseq_lightseq is benchmarked "
                   "(default: the one holding this script)")
    p.add_argument("--_child", help=argparse.SUPPRESS)


def parse(p, argv):
    """p.parse_args(argv) with --check-args (check_args.py) added; a child's arguments are returned as they
    are, a parent's --repo made absolute and checked."""
    check_args.add(p)
    a = p.parse_args(argv)
    if a._child:
        return a
    a.repo = os.path.abspath(a.repo)
    if not os.path.isdir(os.path.join(a.repo, "fairseq_lightseq")):
        p.error(f"--repo {a.repo}: no fairseq_lightseq/ there")
    return a


def use_tree(repo: str) -> None:
    """Makes `import fairseq_lightseq` load the package of checkout `repo` (a benchmark's --repo: the tree
    benchmarked, by default this one), ahead of one the working directory may hold."""
    sys.path.insert(0, repo)


def _start(spec: dict) -> None:
    """What every child does first: its repo's fairseq_lightseq ahead on sys.path, fairseq's INFO off."""
    use_tree(spec.pop("repo"))
    logging.disable(logging.WARNING)


def serve(child, arg: str) -> None:
    """A new interpreter's side of run(): `--_child JSON` -> prints `RESULT <json>`."""
    spec = json.loads(arg)
    _start(spec)
    print("RESULT " + json.dumps(child(spec)), flush=True)


def _forked(entry: str, spec: dict, env: dict, cwd: str, log: str, out: str) -> None:
    """A forked child's side of run(): the caller's environment and working directory, output to `log`,
    the result to `out`."""
    sys.stdin.close()  # the server's requests
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    import warnings
    warnings.simplefilter("ignore")
    if env.get("OMP_NUM_THREADS"):
        import torch
        torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    _start(spec)
    module, function = entry.split(":")
    res = getattr(importlib.import_module(module), function)(spec)
    with open(out, "w") as f:
        json.dump(res, f)


def _serve_forks() -> None:
    """The fork server: imports PRELOAD, then per request line on stdin forks a child, waits for it and
    writes its exit status on stdout; ends at EOF."""
    logging.disable(logging.WARNING)  # fairseq's INFO lines at import (the children turn them off too)
    for name in PRELOAD:
        importlib.import_module(name)
    for line in sys.stdin:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                _forked(**json.loads(line))
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status), flush=True)


if __name__ == "__main__":
    _serve_forks()
