"""The ranks of a multi-process fairseq-train run forked from one process that has already imported
fairseq, instead of started afresh: `run(argvs, cwd, timeout)` runs one fairseq-train process per
command line (each with its own --distributed-rank, as SLURM or a hand launch starts them) and
returns [(exit status, log)].

Each rank is its own process (its own interpreter state, its own gloo connection, the plugin imported
by fairseq's --user-dir, Python's normal exit with its atexit hooks), as a fresh fairseq-train would
be; what it skips is the start-up every fairseq-train pays before parsing its arguments, importing
torch and fairseq (`fairseq_cli.train`, the console script's first line), which costs seconds per
rank. The server is a subprocess of the tests, started once with `support.cli.env()` (one thread)
and reused; it imports nothing but that module, runs no torch op (fork stays safe: no thread pool
yet) and forks each rank from that pristine state.

Protocol: one JSON request per line on the server's stdin ({"argvs", "cwd", "logs", "timeout"}),
one JSON reply per line on its stdout ({"rcs"}, after "ready" and whatever fairseq's import logged); a rank still running at the timeout is killed
(status -9)."""
import json
import os
import signal
import subprocess
import sys
import time

_SERVER = {}


def _child(argv, cwd, log):
    """In the forked rank: output to `log`, fairseq-train's entry point on `argv`; never returns to the
    server's loop (SystemExit ends the interpreter normally)."""
    sys.stdin.close()
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.chdir(cwd)
    sys.argv = list(argv)
    from fairseq_cli.train import cli_main

    sys.exit(cli_main())


def _wait(pids, deadline):
    rcs = {}
    while len(rcs) < len(pids):
        for pid in pids:
            if pid in rcs:
                continue
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                rcs[pid] = os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            for pid in pids:
                if pid not in rcs:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    rcs[pid] = -9
        time.sleep(0.02)
    return [rcs[pid] for pid in pids]


def serve():
    import fairseq_cli.train  # noqa: F401  (the import every rank would otherwise repeat)

    print("ready", flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        pids = []
        for argv, log in zip(req["argvs"], req["logs"]):
            pid = os.fork()
            if pid == 0:
                _child(argv, req["cwd"], log)
            pids.append(pid)
        rcs = _wait(pids, time.monotonic() + req["timeout"])
        print(json.dumps({"rcs": rcs}), flush=True)


def run(argvs, cwd, timeout, env):
    """fairseq-train on each of `argvs` (sys.argv-style, argv[0] the program), concurrently, forked by
    the server (started with environment `env` on first use); returns [(exit status, log)]."""
    server = _SERVER.get("p")
    if server is None or server.poll() is not None:
        server = subprocess.Popen([sys.executable, os.path.abspath(__file__)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, env=env)
        while server.stdout.readline().strip() != "ready":  # fairseq logs to stdout as it imports
            assert server.poll() is None, "the rank server did not start"
        _SERVER["p"] = server
    logs = [os.path.join(str(cwd), f".rank{r}.log") for r in range(len(argvs))]
    server.stdin.write(json.dumps({"argvs": argvs, "cwd": str(cwd), "logs": logs, "timeout": timeout}) + "\n")
    server.stdin.flush()
    rcs = json.loads(server.stdout.readline())["rcs"]
    out = []
    for rc, log in zip(rcs, logs):
        with open(log) as f:
            out.append((rc, f.read()))
        os.remove(log)
    return out


if __name__ == "__main__":
    serve()
