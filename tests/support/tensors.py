"""Devices, dtypes and per-dtype tolerances for kernel-vs-reference checks, and random inputs."""
import pytest
import torch

from fairseq_lightseq.ops import _backend

HAS_CUDA = torch.cuda.is_available() and bool(_backend.BUILD_INFO.get("with_cuda"))

# (device, dtype) pairs every op is checked on: CPU float32/float64/bfloat16, CUDA fp32/fp16/bf16.
CPU_DTYPES = [torch.float32, torch.float64, torch.bfloat16]
CUDA_DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DEVICE_DTYPES = [pytest.param("cpu", dt, id=f"cpu-{str(dt)[6:]}") for dt in CPU_DTYPES] + [
    pytest.param("cuda", dt, id=f"cuda-{str(dt)[6:]}", marks=pytest.mark.cuda) for dt in CUDA_DTYPES
]

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
    if actual.device.type == "cpu":
        assert torch.equal(actual, expected)
    else:
        assert torch.equal(actual == 0, expected == 0)
        assert_close(actual, expected, scale=scale)
