"""What the emulated CUDA device (csrc/emulation/) puts around the kernels so that a test of them can fail:
every CPU allocation made while it is on is poisoned (an output element a kernel leaves unwritten fails its
comparison), the random schedule draws a fresh order for every launch, and every launch is counted by kernel
name (so a run that silently fell back to the CPU kernels can be told apart). The ordering kernel is
tests/emulation/thread_order.cu, built into the emulated library only. Marked cuda_emulated."""
import ctypes

import pytest
import torch

from fairseq_lightseq import ops
from fairseq_lightseq.ops import _backend

pytestmark = pytest.mark.cuda_emulated


def thread_order(threads: int) -> list:
    """The rank of each thread of a one-block launch of `threads` in the order the emulator ran them."""
    lib = ctypes.CDLL(_backend.EMULATION_LIBRARY)
    out = (ctypes.c_int * threads)()
    assert lib.fls_emu_thread_order(threads, out) == 0
    return list(out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64])
def test_allocations_on_the_emulated_device_are_poisoned(dtype):
    poison = _backend.emulated_poison_byte()
    assert poison in (0xFF, 0x7B)
    t = torch.empty(1000, dtype=dtype)
    assert (t.view(torch.uint8) == poison).all()
    if dtype.is_floating_point:  # NaN (0xff), or a huge finite value (0x7b: 1.3e36, in fp16 60768)
        assert t.isnan().all() if poison == 0xFF else (t.isfinite() & (t.abs() > 6e4)).all()


def test_every_launch_is_counted_by_kernel_name():
    before = _backend.emulated_launches()
    x = torch.randn(6, 40)
    ops.layer_norm(x, torch.ones(40), torch.zeros(40))
    ops.layer_norm(x, torch.ones(40), torch.zeros(40))
    after = _backend.emulated_launches()
    grew = {name: n - before.get(name, 0) for name, n in after.items() if n != before.get(name, 0)}
    assert len(grew) == 1 and "ln_fwd" in next(iter(grew)) and next(iter(grew.values())) == 2, grew


def test_index_order_runs_threads_in_index_order(monkeypatch):
    monkeypatch.setenv("FLS_EMULATION_SCHEDULE", "ordered")
    assert thread_order(64) == list(range(64))


def test_the_random_schedule_draws_a_fresh_order_for_every_launch(monkeypatch):
    monkeypatch.setenv("FLS_EMULATION_SCHEDULE", "random")
    orders = [thread_order(64) for _ in range(3)]
    for order in orders:
        assert sorted(order) == list(range(64)) and order != list(range(64))
    assert orders[0] != orders[1] != orders[2] != orders[0]
