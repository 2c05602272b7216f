"""The emulated device's sanitizer checks (csrc/emulation/checks.cpp, the scheduler's synccheck): for each check
a kernel with the hazard fails its launch naming the check, the threads and both call sites, and its correct
twin launches cleanly. The kernels are tests/emulation/checks.cu, built into the emulated libraries only. The
access checks need the checked build (_cuda_emulated_checked.so, `make test-cuda-emulated`'s index-order pass);
synccheck and the shared-memory limit hold in every build. Marked cuda_emulated."""
import ctypes

import pytest
import torch

from fairseq_lightseq.ops import _backend

pytestmark = pytest.mark.cuda_emulated

CUDA_SUCCESS, INVALID_VALUE, ILLEGAL_ADDRESS, ILLEGAL_INSTRUCTION, LAUNCH_FAILURE = 0, 1, 700, 715, 719


def library():
    lib = ctypes.CDLL(_backend.EMULATION_LIBRARY)
    lib.fls_emu_error_string.restype = ctypes.c_char_p
    return lib


def run_case(which: int):
    """(status, message): the launch status of check kernel `which` and its error string."""
    lib = library()
    out = torch.zeros(64)
    status = lib.fls_emu_check_case(which, ctypes.c_void_p(out.data_ptr()))
    return status, lib.fls_emu_error_string(status).decode()


def needs_checks():
    if not library().fls_emu_checks_on():
        pytest.skip("the access checks run on the checked build (FLS_CUDA_EMULATION_LIBRARY=_cuda_emulated_checked.so)")


# (hazard kernel, status, words of its message, whether it needs the checked build); its twin is which + 1.
CASES = [
    (0, LAUNCH_FAILURE, ["racecheck: shared memory write-after-read hazard on shared array 'cell' byte 0",
                         "thread [0,0,0] at tests/emulation/checks.cu:16", "thread [63,0,0] at tests/emulation/checks.cu:18"],
     True),
    (2, LAUNCH_FAILURE, ["racecheck: shared memory write-after-write hazard", "thread [0,0,0] at tests/emulation/checks.cu:25",
                         "thread [32,0,0] at tests/emulation/checks.cu:27"], True),
    (4, LAUNCH_FAILURE, ["racecheck: shared memory read-after-write hazard", "thread [0,0,0] at tests/emulation/checks.cu:38",
                         "thread [1,0,0] at tests/emulation/checks.cu:41"], True),
    (6, LAUNCH_FAILURE, ["global race: read-after-write between blocks", "block [0,0,0] thread [0,0,0] at "
                         "tests/emulation/checks.cu:48", "block [1,0,0] thread [0,0,0] at tests/emulation/checks.cu:49"],
     True),
    (8, LAUNCH_FAILURE, ["initcheck: thread [0,0,0] at tests/emulation/checks.cu:61", "reads shared array 'scratch' byte 8,",
                         "which no thread of the block wrote"], True),
    (10, LAUNCH_FAILURE, ["synccheck: divergent __syncthreads: thread [0,0,0] waits at tests/emulation/checks.cu:73",
                          "thread [16,0,0] at tests/emulation/checks.cu:75"], False),
    (12, ILLEGAL_INSTRUCTION, ["synccheck: lanes 0 and 16 of one warp meet at a warp operation from different call sites, "
                               "tests/emulation/checks.cu:83 and tests/emulation/checks.cu:84"], False),
    (14, ILLEGAL_ADDRESS, ["bounds: thread [0,0,0] at tests/emulation/checks.cu:94 writes 4 bytes at byte 128 of shared "
                           "array 'row' (128 bytes): out of bounds"], True),
    (16, INVALID_VALUE, ["static shared memory of 32768 bytes (array 'big') plus 16388 bytes of dynamic shared memory "
                         "exceeds the 49152 bytes a block may use"], False),
]


@pytest.mark.parametrize("which,status,words,checked", CASES, ids=[str(c[0]) for c in CASES])
def test_each_check_fails_the_launch_with_its_hazard_naming_both_sites(which, status, words, checked):
    if checked:
        needs_checks()
    got, message = run_case(which)
    assert got == status and all(w in message for w in words), message


@pytest.mark.parametrize("which", [c[0] + 1 for c in CASES])
def test_each_correct_twin_launches_cleanly(which):
    got, message = run_case(which)
    assert got == CUDA_SUCCESS, message
