"""Test layout: tests/ops (each op family: kernels vs the reference), tests/fairseq (model, criterion,
optimizer, checkpoints, training modes through fairseq's Python API), tests/e2e (fairseq's command
line, the recipe, the demo; marked `e2e`: fairseq's commands with the plugin run inside this process,
support/inprocess.py, and in their own processes only where the process is what is tested). Shared
helpers live in tests/support/."""
import os
import sys

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(TESTS))  # the source tree (the extension is built in place)
sys.path.insert(0, TESTS)  # `support`

from support.tensors import HAS_CUDA, HAS_EMULATED_CUDA  # noqa: E402
from fairseq_lightseq.ops import _backend  # noqa: E402


def pytest_collection_modifyitems(config, items):
    """Without a GPU, CUDA tests are skipped, saying why they cannot run on the emulated CUDA device either: the
    default reason, or the test's own (`@pytest.mark.cuda(why="...")`)."""
    reason = ("needs a CUDA device and the CUDA build of fairseq_lightseq._C (a cuda_emu case of the test, where "
              "there is one, runs our kernels on the emulated CUDA device, which has no CUDA tensors and none of "
              "torch's own CUDA ops: cuBLAS, SDPA, flash attention, the caching allocator, NCCL)")
    skip_emulated = pytest.mark.skip(reason="runs on the emulated CUDA device: make test-cuda-emulated")
    for item in items:
        if "cuda" in item.keywords and not HAS_CUDA:
            marker = item.get_closest_marker("cuda")
            why = marker.kwargs.get("why") if marker is not None else None
            item.add_marker(pytest.mark.skip(reason=f"needs a CUDA device: {why}" if why else reason))
        if "cuda_emulated" in item.keywords and not HAS_EMULATED_CUDA:
            item.add_marker(skip_emulated)


@pytest.fixture(autouse=True)
def _emulated_cuda_device(request):
    """Tests marked cuda_emulated run with the ops on the emulated CUDA device."""
    if request.node.get_closest_marker("cuda_emulated") is None:
        yield
    else:
        with _backend.emulated_cuda():
            yield
