"""The time a memory-bound op would take on a GPU, from the bytes it must move and the kernels it launches:

    time = max(bytes / HBM bandwidth, compute) + launches x launch overhead

The bandwidth is the data sheet's (H100 SXM 3.35 TB/s, H200 4.8 TB/s); a copy reaches about 88% of it
on the H200 (4219 GB/s, bench_ops' device-to-device copy in benchmarks/runs/2026-11-29-h200-gpu-check-
vectorised-kernels), so `fraction` (of the data-sheet bound) near 0.9 is as good as a kernel gets. The
launch overhead is the gap a kernel costs back to back on the device (ramp-up and drain of its grid), not
host time: 3 microseconds, a planning figure that scripts.kernel_profile.gpu_times measures on the next GPU.
Compute: the ops here do a few flops a byte, far under the SMs' rate, except the attention products (the
probabilities times v on the tensor cores through cuBLAS, our varlen kernels' products on the CUDA cores in
fp32): their time at the data sheet's rate is the other term of the max. GELU (erf, about 20 flops an
element) is left out: 20 flops a 2-byte element is under the fp32 rate's share of the bandwidth bound.
"""
from typing import NamedTuple


class Gpu(NamedTuple):
    name: str
    hbm: float  # bytes/s, data sheet
    tensor_flops: float  # dense fp16/bf16 tensor-core flop/s, data sheet
    fp32_flops: float  # fp32 flop/s of the CUDA cores (FMA), data sheet
    launch_overhead: float = 3e-6  # seconds a launch adds back to back


GPUS = {
    "H100": Gpu("H100 SXM", 3.35e12, 989e12, 67e12),
    "H200": Gpu("H200", 4.8e12, 989e12, 67e12),
}


class Prediction(NamedTuple):
    seconds: float
    bound: float  # bytes / HBM bandwidth alone
    fraction: float  # bound / seconds: the share of the bandwidth bound the op reaches


def predict(gpu: Gpu, nbytes: float, launches: int, tensor_flops: float = 0.0, fp32_flops: float = 0.0) -> Prediction:
    """The predicted seconds of an op moving `nbytes` in `launches` kernels, with `tensor_flops` on the tensor
    cores and `fp32_flops` on the CUDA cores."""
    bound = nbytes / gpu.hbm
    compute = tensor_flops / gpu.tensor_flops + fp32_flops / gpu.fp32_flops
    seconds = max(bound, compute) + launches * gpu.launch_overhead
    return Prediction(seconds, bound, bound / seconds if seconds > 0 else 0.0)
