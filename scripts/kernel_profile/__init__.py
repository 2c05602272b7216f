"""The kernel profile: how fast the CUDA kernels would run, measured without a GPU (docs/gpu_check.md,
"What the kernel profile proves").

    python -m scripts.kernel_profile [--ops ...] [--shapes base,big,large] [--dtype fp16,bf16,fp32] [--json FILE]

Per op of scripts/bench_ops.py (the fused loss and the Adam step included: every op of csrc/cuda), shape and
dtype: every kernel its forward and backward launch (the Adam step: its one pass, "step"; from the emulated
device, launches.py), each with its registers, spills and shared memory from ptxas for sm_90 and
sm_80 (resources.py) and the theoretical occupancy of its launch configuration (occupancy.py); the bytes the op
must move and the time it would take on an H100 and an H200 (roofline.py). gpu_times.py measures the same
ops' kernels on a GPU beside the prediction (a step of scripts/gpu_check.sh).
"""
