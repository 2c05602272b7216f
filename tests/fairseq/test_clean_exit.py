"""fairseq_lightseq.patches.clean_exit.stop_data_buffer_threads stops fairseq's data-buffer threads (real
BufferedIterators) whether they are blocked on a full buffer or busy producing, and leaves nothing
alive. (That importing fairseq_lightseq registers it with atexit, and that this keeps fairseq-train
from aborting, is tested through the command line in tests/e2e/test_clean_exit_cli.py.)"""
import threading
import time

import torch
from fairseq.data.iterators import BackgroundConsumer, BufferedIterator

from fairseq_lightseq.patches import clean_exit


class TorchBatches:
    """An iterable of n batches, each made by `work` small torch ops (as collating does)."""

    def __init__(self, n, work):
        self.n, self.work = n, work

    def __len__(self):
        return self.n

    def __iter__(self):
        for i in range(self.n):
            x = torch.randn(64)
            for _ in range(self.work):
                x = torch.cat([x[1:], x[:1]]) * 1.0001
            yield x.sum() + i


def _live_consumers():
    return [t for t in threading.enumerate() if isinstance(t, BackgroundConsumer) and t.is_alive()]


def test_stops_blocked_and_busy_consumers():
    blocked = BufferedIterator(2, TorchBatches(50, 10))  # fills its buffer of 2, then waits in put()
    busy = BufferedIterator(20, TorchBatches(10 ** 6, 2000))  # always collating
    next(blocked), next(busy)
    time.sleep(0.2)
    assert len(_live_consumers()) == 2
    assert blocked._queue.full()
    assert clean_exit.stop_data_buffer_threads(timeout_s=30) == 2
    assert _live_consumers() == []


def test_nothing_to_stop():
    assert clean_exit.stop_data_buffer_threads() == 0
