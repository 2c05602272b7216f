"""Running a function in W CPU processes that form a gloo process group (torch.distributed tests).

    results = run(check_all, 4, seed)   # check_all(seed) in ranks 0..3; [result of rank 0, ..]

The processes are forked from a multiprocessing fork server that has imported fairseq_lightseq once
(importing fairseq costs seconds per process; plain fork is no option: a child of a process whose
OpenMP threads ran hangs in its first parallel op).
"""
import datetime
import multiprocessing
import os
import sys
import tempfile
import time
import traceback

import torch

_CTX = multiprocessing.get_context("forkserver")
_CTX.set_forkserver_preload(["torch.distributed", "fairseq_lightseq"])


def _ensure_server():
    """Starts the fork server (once) with this process's sys.path as its PYTHONPATH: Python 3.11's
    server ignores the sys.path it is handed, and a preload module it cannot find is skipped silently
    (each child would import it again)."""
    from multiprocessing import forkserver

    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(sys.path)
    try:
        forkserver.ensure_running()
    finally:
        if old is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = old


def _rank_main(fn, args, rank, world_size, init_method, timeout, out_path):
    import torch.distributed as dist

    torch.set_num_threads(1)  # W processes share the cores; the tensors are small
    try:
        dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout))
        result = ("ok", fn(*args))
    except BaseException:
        result = ("error", traceback.format_exc())
    # written before the process group closes: a failing rank's file comes before the failures it
    # causes in the ranks that were waiting for it
    torch.save(result, out_path + ".tmp")
    os.replace(out_path + ".tmp", out_path)  # the parent sees a whole file or none
    if dist.is_initialized():
        dist.destroy_process_group()


def _failures(outs):
    """The tracebacks of every rank that has failed so far."""
    failed = []
    for r, path in enumerate(outs):
        if os.path.exists(path):
            status, value = torch.load(path, weights_only=False)
            if status == "error":
                failed.append(f"rank {r} of {len(outs)} failed:\n{value}")
    return "\n".join(failed)


def run(fn, world_size, *args, timeout=120):
    """fn(*args) in each of `world_size` new processes, torch.distributed initialised in each (gloo,
    rank 0..world_size-1, the default group = all of them). fn must be importable by name (a
    module-level function) and return something torch.save can write (tensors, numbers, dicts).
    Returns the results, rank 0 first. When a rank raises, the tracebacks of the ranks that failed
    (the first, and those that lost their connection to it) are raised here as a RuntimeError and the
    other ranks (likely waiting in a collective) are killed; all are after `timeout` s (TimeoutError)."""
    _ensure_server()
    with tempfile.TemporaryDirectory(prefix="fls_dist_") as d:
        init = "file://" + os.path.join(d, "store")
        outs = [os.path.join(d, f"rank{r}.pt") for r in range(world_size)]
        procs = [_CTX.Process(target=_rank_main, args=(fn, args, r, world_size, init, timeout, outs[r]))
                 for r in range(world_size)]
        for p in procs:
            p.start()
        results, deadline, finished = {}, time.monotonic() + timeout, False
        try:
            while len(results) < world_size:
                for r, p in enumerate(procs):
                    if r in results:
                        continue
                    if os.path.exists(outs[r]):
                        status, value = torch.load(outs[r], weights_only=False)
                        if status == "error":
                            raise RuntimeError(_failures(outs))
                        results[r] = value
                    elif p.exitcode is not None and not os.path.exists(outs[r]):  # (it may have just written)
                        raise RuntimeError(f"rank {r} of {world_size} exited with code {p.exitcode} "
                                           "without a result")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"ranks {sorted(set(range(world_size)) - set(results))} of "
                                       f"{world_size} still running after {timeout} s")
                time.sleep(0.02)
            finished = True
        finally:
            for p in procs:
                if finished:  # every rank wrote its result and is closing its process group
                    p.join(timeout=30)
                if p.is_alive():
                    p.kill()
                p.join()
        return [results[r] for r in range(world_size)]
