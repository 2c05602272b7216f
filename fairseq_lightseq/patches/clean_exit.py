"""Stops fairseq's data-buffer threads before Python finalises, so that a run that succeeded exits 0.

The defect (fairseq's, made visible by any run that leaves one of these threads busy): fairseq wraps
every epoch iterator in a `BufferedIterator` whose `BackgroundConsumer` is a *daemon* thread that
collates the next batches (`--data-buffer-size`, default 10) while the main thread trains. When the
main thread stops iterating early (training ends at `--max-update` or `--stop-time-hours` in the
middle of an epoch, validation stops at `--max-valid-steps`), that thread keeps collating until the
buffer is full. If the interpreter finalises meanwhile, CPython before 3.14 (cpython gh-87135) ends a
daemon thread that asks for the GIL back with `pthread_exit`, a forced stack unwind. The collating
thread is normally inside a torch op (torch releases the GIL around every op) and takes the GIL back
from a `noexcept` C++ frame; unwinding through one calls `std::terminate`: "terminate called without
an active exception", SIGABRT, exit status 134 after "done training". gdb on fairseq-train shows the
data-buffer thread at that moment: `THPVariable_sum -> at::native::sum -> ~TensorIteratorBase ->
TensorImpl::decref_pyobject -> gil_scoped_acquire -> take_gil -> PyThread_exit_thread ->
pthread_exit -> _Unwind_ForcedUnwind -> __gxx_personality_v0 -> std::terminate`.
Native fairseq aborts the same way (`--max-valid-steps 0` with a validation set of more than
`--data-buffer-size` batches aborts on every run); elsewhere it is a matter of thread timing (a
loaded machine starves the collating thread). Our compiled library starts no threads of its own:
its CPU kernels use ATen's parallel_for, i.e. torch's OpenMP pool (the one libgomp, shared by
soname), which is idle between ops and never enters Python.

The fix: an `atexit` hook. atexit callbacks run after the non-daemon threads are joined and before
the interpreter is marked as finalising, so the threads still run normally there. The hook tells
each live BackgroundConsumer to stop after the batch in hand (its own stop condition,
`count >= _max_len`), drains its queue so that a blocked `put` returns, and joins it. A consumer
that does not finish within `TIMEOUT_S` (a stuck DataLoader worker) is left to Python as before,
with a warning.
"""
import atexit
import logging
import queue
import threading
import time

logger = logging.getLogger(__name__)

TIMEOUT_S = 60.0


def _consumers():
    """The live fairseq BackgroundConsumer threads (none if fairseq's iterators were never imported)."""
    import sys

    iterators = sys.modules.get("fairseq.data.iterators")
    cls = getattr(iterators, "BackgroundConsumer", None)
    if cls is None:
        return []
    return [t for t in threading.enumerate() if isinstance(t, cls) and t.is_alive()]


def _drain(q: "queue.Queue") -> None:
    while True:
        try:
            q.get_nowait()
        except queue.Empty:
            return


def stop_data_buffer_threads(timeout_s: float = TIMEOUT_S) -> int:
    """Stop and join every live fairseq BackgroundConsumer; returns how many were stopped.

    Safe to call at any time the iterators are no longer used (it discards their buffered batches).
    """
    threads = _consumers()
    deadline = time.monotonic() + timeout_s
    for t in threads:
        # BackgroundConsumer.run: `put(item); count += 1; if count >= _max_len: break`, then puts a
        # sentinel. _max_len = 0 ends it after the current item; draining unblocks its puts.
        t._max_len = 0
        while t.is_alive() and time.monotonic() < deadline:
            _drain(t._queue)
            t.join(0.01)
        if t.is_alive():
            logger.warning("fairseq data-buffer thread %s did not stop within %.0f s; the process may abort "
                           "at exit (use --data-buffer-size 0 to avoid the thread)", t.name, timeout_s)
    return len(threads)


def install() -> None:
    """Registers stop_data_buffer_threads with atexit (idempotent: atexit runs a function registered
    twice twice, so a second install unregisters the first)."""
    atexit.unregister(stop_data_buffer_threads)
    atexit.register(stop_data_buffer_threads)
