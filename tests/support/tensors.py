"""Devices, dtypes and per-dtype tolerances for kernel-vs-reference checks, and random inputs."""
import pytest
import torch

from fairseq_lightseq.ops import _backend

HAS_CUDA = torch.cuda.is_available() and bool(_backend.BUILD_INFO.get("with_cuda"))
# The emulated CUDA device (csrc/emulation/, `make test-cuda-emulated`): CPU tensors whose ops run the CUDA
# implementations and kernels. A test parametrised with EMULATED_CUDA (device "cpu", marked cuda_emulated)
# runs inside _backend.emulated_cuda() (tests/conftest.py).
HAS_EMULATED_CUDA = _backend.EMULATION_LOADED and _backend._C is not None
EMULATED_CUDA = pytest.param("cpu", id="cuda_emu", marks=pytest.mark.cuda_emulated)
CUDA = pytest.param("cuda", id="cuda", marks=pytest.mark.cuda)
DEVICES = ["cpu", CUDA, EMULATED_CUDA]  # for tests parametrised by device alone
CUDA_DEVICES = [CUDA, EMULATED_CUDA]  # for tests of the CUDA kernels against the CPU kernels


def cpu_kernels():
    """A context in which the ops run the CPU kernels, also inside an emulated-device test (to compare)."""
    return _backend.emulated_cuda(False)


# (device, dtype) pairs every op is checked on: CPU float32/float64/bfloat16, CUDA fp32/fp16/bf16 on a GPU
# and on the emulated device.
CPU_DTYPES = [torch.float32, torch.float64, torch.bfloat16]
CUDA_DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DEVICE_DTYPES = (
    [pytest.param("cpu", dt, id=f"cpu-{str(dt)[6:]}") for dt in CPU_DTYPES]
    + [pytest.param("cuda", dt, id=f"cuda-{str(dt)[6:]}", marks=pytest.mark.cuda) for dt in CUDA_DTYPES]
    + [pytest.param("cpu", dt, id=f"cuda_emu-{str(dt)[6:]}", marks=pytest.mark.cuda_emulated) for dt in CUDA_DTYPES]
)


def on_cuda(t: torch.Tensor) -> bool:
    """Whether t's ops run the CUDA kernels: a CUDA tensor, or any tensor on the emulated device."""
    return t.device.type == "cuda" or _backend.emulating()

# Kernel vs reference, both computing in fp32 (fp64) and rounding once to the storage dtype:
# (rtol, atol) per storage dtype.
TOL = {
    torch.float64: (1e-10, 1e-10),
    torch.float32: (1e-5, 1e-5),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (2e-2, 2e-2),
}


def assert_close(actual, expected, dtype=None, scale=1.0, msg=""):
    """Compare with the tolerance of `dtype` (default: actual's), loosened by `scale`."""
    rtol, atol = TOL[dtype or actual.dtype]
    torch.testing.assert_close(actual.double(), expected.double(), rtol=rtol * scale, atol=atol * scale, msg=msg or None)


def randn(*shape, dtype=torch.float32, device="cpu", requires_grad=False, seed=None):
    """Random normal values (never zeros), created in float32 on CPU then cast, so that the same
    seed gives the same values on every device."""
    g = torch.Generator().manual_seed(seed) if seed is not None else None
    t = torch.randn(*shape, generator=g).to(device=device, dtype=dtype)
    return t.requires_grad_(requires_grad)


def assert_same_or_close(actual, expected, scale=2.0):
    """The same bits on the CPU, whose kernels compute each row (element) alone whatever the tensor around
    it; on CUDA the same zeros (dropout masks, padding) and values within `scale` x the dtype's tolerance
    (a smaller problem may take another kernel path, with another summation order)."""
    if not on_cuda(actual):
        assert torch.equal(actual, expected)
    else:
        assert torch.equal(actual == 0, expected == 0)
        assert_close(actual, expected, scale=scale)
