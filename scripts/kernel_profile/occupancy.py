"""Theoretical occupancy of a kernel launch, computed as CUDA's occupancy calculator does
(cuda_occupancy.h, cudaOccMaxActiveBlocksPerMultiprocessor) for the two architectures the kernels are built
for: the resident blocks per SM are the least of the limits set by warps, registers, shared memory and the
block count, and occupancy is their warps over the SM's 64.
"""
from typing import NamedTuple


class Arch(NamedTuple):
    """The per-SM limits of one compute capability (CUDA C Programming Guide, "Compute Capabilities")."""
    name: str
    max_warps: int = 64  # 2048 threads
    max_blocks: int = 32
    regs: int = 65536
    reg_granularity: int = 256  # registers are allocated per warp, in units of 256
    max_regs_per_thread: int = 255
    sub_partitions: int = 4  # the register file is split between 4 schedulers; a warp lives in one
    smem: int = 0  # bytes of shared memory per SM at the largest carveout
    smem_per_block: int = 0  # the most one block may use (opted in)
    smem_granularity: int = 128
    smem_reserved: int = 1024  # per block, kept by the driver (cudaDevAttrReservedSharedMemoryPerBlock)


ARCHS = {
    "sm_90": Arch("sm_90", smem=228 * 1024, smem_per_block=227 * 1024),
    "sm_80": Arch("sm_80", smem=164 * 1024, smem_per_block=163 * 1024),
}


class Occupancy(NamedTuple):
    blocks: int  # resident blocks per SM
    warps: int  # resident warps per SM
    fraction: float  # warps / the SM's maximum
    limit: str  # what bounds it: warps, blocks, registers or shared memory (the first of a tie)


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def occupancy(arch: Arch, threads: int, regs: int, smem: int) -> Occupancy:
    """Resident blocks and warps per SM of a launch of `threads` threads a block, each using `regs` registers,
    and `smem` bytes of shared memory a block (static + dynamic). A launch that cannot run at all (too many
    registers or too much shared memory for one block) raises ValueError naming the limit."""
    if not 0 < threads <= 1024:
        raise ValueError(f"threads per block must be 1..1024, got {threads}")
    if regs > arch.max_regs_per_thread:
        raise ValueError(f"{regs} registers per thread: at most {arch.max_regs_per_thread}")
    warps = (threads + 31) // 32
    limits = {"warps": arch.max_warps // warps, "blocks": arch.max_blocks}
    regs_per_warp = _round_up(max(regs, 1) * 32, arch.reg_granularity)
    # warps fit per scheduler's quarter of the register file, and a block's warps spread over the quarters
    warps_by_regs = (arch.regs // arch.sub_partitions) // regs_per_warp * arch.sub_partitions
    if regs_per_warp * _round_up(warps, arch.sub_partitions) > arch.regs:
        raise ValueError(f"{regs} registers x {threads} threads exceed the {arch.regs} registers of a block")
    limits["registers"] = warps_by_regs // warps
    smem_block = _round_up(smem + arch.smem_reserved, arch.smem_granularity)
    if smem > arch.smem_per_block:
        raise ValueError(f"{smem} bytes of shared memory per block: at most {arch.smem_per_block} on {arch.name}")
    limits["shared memory"] = arch.smem // smem_block
    limit = min(limits, key=lambda k: limits[k])
    blocks = limits[limit]
    return Occupancy(blocks, blocks * warps, blocks * warps / arch.max_warps, limit)
