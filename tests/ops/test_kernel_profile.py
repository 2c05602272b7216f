"""scripts/kernel_profile: the occupancy calculator against values CUDA's calculator gives, the ptxas report
parser, the kernel names ptxas and the emulated device share, the ideal bytes and the prediction."""
import pytest

from scripts import bench_ops
from scripts.kernel_profile import launches
from scripts.kernel_profile import occupancy as occ
from scripts.kernel_profile import roofline
from scripts.kernel_profile.resources import Resources, parse_ptxas, short_name

SM90, SM80 = occ.ARCHS["sm_90"], occ.ARCHS["sm_80"]


@pytest.mark.parametrize("arch, threads, regs, smem, blocks, warps, limit", [
    # 193 registers: 6400 a warp (rounded to 256), 2 warps per scheduler's 16384 -> 8 warps, 2 blocks of 4
    (SM90, 128, 193, 16384, 2, 8, "registers"),
    (SM90, 128, 128, 32768, 4, 16, "registers"),  # 4096 a warp: 4 a scheduler
    (SM90, 256, 32, 0, 8, 64, "warps"),  # full
    (SM90, 256, 64, 0, 4, 32, "registers"),
    (SM90, 128, 72, 0, 7, 28, "registers"),  # 72 x 32 = 2304 = 9 x 256: 7 warps a scheduler
    (SM90, 32, 16, 0, 32, 32, "blocks"),  # 32 blocks an SM at most
    # 48 KiB static + 1 KiB the driver keeps per block: 228 KiB / 49 KiB = 4 blocks; 164 / 49 = 3 on sm_80
    (SM90, 256, 32, 48 * 1024, 4, 32, "shared memory"),
    (SM80, 256, 32, 48 * 1024, 3, 24, "shared memory"),
    (SM80, 128, 128, 32768, 4, 16, "registers"),  # 4 x 33 KiB = 132 KiB fits sm_80's 164
    (SM80, 1024, 64, 0, 1, 32, "registers"),
    (SM90, 1024, 32, 0, 2, 64, "warps"),
])
def test_occupancy_matches_cuda_calculator(arch, threads, regs, smem, blocks, warps, limit):
    o = occ.occupancy(arch, threads, regs, smem)
    assert (o.blocks, o.warps, o.limit) == (blocks, warps, limit)
    assert o.fraction == warps / 64


def test_occupancy_refuses_what_cannot_launch():
    with pytest.raises(ValueError, match="registers x 1024 threads"):
        occ.occupancy(SM90, 1024, 128, 0)  # 131072 registers for one block
    with pytest.raises(ValueError, match="shared memory per block"):
        occ.occupancy(SM80, 128, 32, 200 * 1024)
    with pytest.raises(ValueError, match="threads per block"):
        occ.occupancy(SM90, 2048, 32, 0)


PTXAS = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_ZN3fls4cuda12_GLOBAL__N_118ln_bwd_warp_kernelI6__halfLi4EEEvPKT_' for 'sm_90'
ptxas info    : Function properties for _ZN3fls4cuda12_GLOBAL__N_118ln_bwd_warp_kernelI6__halfLi4EEEvPKT_
    264 bytes stack frame, 324 bytes spill stores, 468 bytes spill loads
ptxas info    : Used 128 registers, used 1 barriers, 264 bytes cumulative stack size, 16384 bytes smem, 4 bytes cmem[0]
ptxas info    : Compiling entry function '_Z1kv' for 'sm_90'
ptxas info    : Function properties for _Z1kv
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, used 0 barriers
"""


def test_parse_ptxas():
    got = parse_ptxas(PTXAS)
    ln = "_ZN3fls4cuda12_GLOBAL__N_118ln_bwd_warp_kernelI6__halfLi4EEEvPKT_"
    assert got == {ln: Resources(128, 324, 468, 264, 16384), "_Z1kv": Resources(40, 0, 0, 0, 0)}


def test_short_name_is_the_same_for_ptxas_and_the_emulated_device():
    ptxas = "void fls::cuda::(anonymous namespace)::ln_bwd_warp_kernel<__half, 4>(const __half *, int)"
    emulated = "fls::cuda::{anonymous}::ln_bwd_warp_kernel<__half, 4>"
    assert short_name(ptxas) == short_name(emulated) == "ln_bwd_warp_kernel<__half, 4>"
    assert short_name("void fls::cuda::(anonymous namespace)::merge_heads_vec_kernel(fls::cuda::Parts<uint4>)") == \
        "merge_heads_vec_kernel"


def test_ideal_bytes_and_prediction():
    large = bench_ops.SHAPES["large"]
    fwd, bwd = bench_ops.ideal_bytes(large, 2)["layer_norm"]
    assert (fwd, bwd) == (2 * 65536 * 1024 * 2, 3 * 65536 * 1024 * 2)  # x read, y written; dy, x read, dx written
    h200 = roofline.GPUS["H200"]
    p = roofline.predict(h200, fwd, 1)
    assert p.bound == pytest.approx(fwd / 4.8e12)
    assert p.seconds == pytest.approx(p.bound + 3e-6) and 0.9 < p.fraction < 1
    # a compute-bound op: the flops' time replaces the bandwidth bound
    assert roofline.predict(h200, 1e6, 0, fp32_flops=67e9).seconds == pytest.approx(1e-3)


def test_ideal_bytes_of_the_loss_and_the_adam_step():
    large = bench_ops.SHAPES["large"]
    n, v = 65536, 32000
    nbytes = bench_ops.ideal_bytes(large, 2)
    # logits read (+ targets, loss, nll, lse); logits read and their gradient written (+ targets, dloss, dnll, lse)
    assert nbytes["label_smoothed_cross_entropy"] == (n * v * 2 + 20 * n, 2 * n * v * 2 + 20 * n)
    params = bench_ops.adam_params(large)
    assert 205e6 < params < 215e6  # Transformer-big's
    assert nbytes["adam_step"] == (26 * params,)  # fp32 params and state read and written, fp16 grads read
    assert bench_ops.adam_params(launches.reduced(large, 1)) == 12 * 2**20 + 13 * 1024  # the sample: an encoder layer


def test_gpu_times_row_puts_the_prediction_beside_the_measurement():
    """The GPU check's kernel_times step (scripts/kernel_profile/gpu_times.py) without a GPU: one pass's CUPTI
    times and launch counts against the roofline of the device it names."""
    from scripts.kernel_profile import gpu_times

    h200 = gpu_times.gpu_of("NVIDIA H200")
    assert h200 is roofline.GPUS["H200"] and gpu_times.gpu_of("NVIDIA A10") is None
    nbytes = 256 * 2**20
    kernels = {"ln_fwd_warp_kernel": (80e-6, 1.0), "memset": (2e-6, 1.0)}  # seconds and launches per call
    row = gpu_times.compare("layer_norm", "fwd", nbytes, {}, kernels, h200)
    assert row["launches"] == 2 and row["measured_us"] == pytest.approx(82.0)
    assert row["predicted_us"] == pytest.approx((nbytes / 4.8e12 + 2 * 3e-6) * 1e6)
    assert row["measured_over_predicted"] == pytest.approx(82.0 / row["predicted_us"])
    assert list(row["kernels_us"]) == ["ln_fwd_warp_kernel", "memset"]  # longest first
    line = gpu_times.table([dict(row, shape="large", dtype="fp16")]).splitlines()[1]
    assert "layer_norm" in line and f"{row['measured_over_predicted']:.2f}x" in line
    assert "-" in gpu_times.table([dict(gpu_times.compare("x", "fwd", 1, {}, kernels, None), shape="a", dtype="b")])
