"""The emulated CUDA device itself (csrc/emulation/): launches that break CUDA's rules fail as CUDA fails them,
and kernels that misuse barriers, shuffles or shared memory fail their launch with an error that names the
kernel (never a hang, never a pass). The kernels are tests/emulation/misuse.cu, built into the emulated library
only. Marked cuda_emulated (make test-cuda-emulated)."""
import ctypes
import os

import pytest
import torch

from fairseq_lightseq.ops import _backend

pytestmark = pytest.mark.cuda_emulated

CUDA_SUCCESS, INVALID_VALUE, INVALID_CONFIGURATION, ASSERT = 0, 1, 9, 710
ILLEGAL_INSTRUCTION, LAUNCH_FAILURE = 715, 719


def misuse(which: int):
    """(status, message, out): the launch status of misuse kernel `which`, its error string, its output."""
    lib = ctypes.CDLL(_backend.EMULATION_LIBRARY)
    lib.fls_emu_error_string.restype = ctypes.c_char_p
    out = torch.zeros(64)
    status = lib.fls_emu_misuse(which, ctypes.c_void_p(out.data_ptr()))
    return status, lib.fls_emu_error_string(status).decode(), out


# (misuse, status, words of the message): launches over the hardware's limits fail as CUDA fails them (the
# message names the kernel's launch); kernels that misuse barriers, shuffles or asserts fail naming the kernel.
MISUSES = [
    (0, INVALID_CONFIGURATION, "block 1025x1x1 (at most 1024 threads"),
    (1, INVALID_CONFIGURATION, "grid 1x65536x1"),
    (2, INVALID_VALUE, "49156 bytes of dynamic shared memory"),
    (3, INVALID_VALUE, "static shared memory of 52000 bytes (array 'big')"),
    (4, LAUNCH_FAILURE, "a barrier not every thread of the block reaches (kernel"),
    (5, ILLEGAL_INSTRUCTION, "leaves out the calling lane 0"),
    (6, ILLEGAL_INSTRUCTION, "a shuffle reads lane 20, which is not in its mask"),
    (7, ILLEGAL_INSTRUCTION, "names lane 8, which this block does not have"),
    (8, ASSERT, "device assert in kernel"),
]
KERNELS = ["empty_kernel", "empty_kernel", "empty_kernel", "big_static_shared_kernel", "divergent_barrier_kernel",
           "shuffle_without_caller_kernel", "shuffle_from_inactive_lane_kernel", "missing_lane_kernel", "assert_kernel"]


@pytest.mark.parametrize("which,status,words", MISUSES)
def test_each_misuse_fails_its_launch_as_cuda_would_naming_the_kernel(which, status, words):
    got, message, _ = misuse(which)
    assert got == status and words in message and KERNELS[which] in message, message


def test_a_read_before_the_barrier_sees_poison_not_the_value():
    """Thread 0 reads a shared cell that the block's last thread (another warp) writes, with no barrier between:
    the warps run one after the other up to a barrier, so in index order thread 0 reads the poison. The checked
    build reports the read itself (initcheck: nothing wrote the cell yet)."""
    if os.environ.get("FLS_EMULATION_SCHEDULE", "ordered") != "ordered":
        pytest.skip("the read's outcome depends on the warp order, which the random schedule shuffles")
    status, message, out = misuse(9)
    if ctypes.CDLL(_backend.EMULATION_LIBRARY).fls_emu_checks_on():
        assert status == LAUNCH_FAILURE and "initcheck: thread [0,0,0]" in message, message
    else:
        assert status == CUDA_SUCCESS and (out[:1].view(torch.uint8) == _backend.emulated_poison_byte()).all()


def test_a_valid_three_dimensional_launch_succeeds():
    assert misuse(10)[0] == CUDA_SUCCESS
