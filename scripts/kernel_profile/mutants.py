"""Proof that the kernel profile's guard bites: kernels made slow but still correct, one at a time, each
checked by the guard (scripts/kernel_profile/guard.py) against the recorded floors.

    python -m scripts.cuda_mutants --perf [--only N ...] [--json FILE]

For every mutant: a copy of csrc/ with the edits of one kernel file, the emulated device's checked build (the
one whose kernels are observed) rebuilt from that copy (the files the edit reaches; the others are
`make emulated`'s objects), ptxas run on the changed files, and the guard run on it. One row per mutant: the
file, the slowdown, and the guard's first finding or NOT CAUGHT. Exit status 1 when a mutant was not caught
(or its edit no longer applies). Needs `make build emulated` and nvcc (for the occupancy and spills).
"""
import os
import subprocess
import sys
from typing import List, NamedTuple, Tuple

from scripts.cuda_mutants import ROOT, build, run_mutants


class PerfMutant(NamedTuple):
    file: str  # under csrc/cuda/
    bug: str  # the slowdown
    edits: List[Tuple[str, str]]  # (old, new): every occurrence of old replaced
    ops: str  # the ops of bench_ops whose kernels the edit reaches (the guard measures those)


DROPOUT_OPS = "bias_dropout_residual,bias_act_dropout[gelu]"
PERF_MUTANTS = [
    PerfMutant("dropout.cu", "scalar loads instead of 16-byte vectors (the fast forward reads x element by element)",
               [("const Pack<T> xv = *reinterpret_cast<const Pack<T>*>(x + e);",
                 "Pack<T> xv;\n#pragma unroll\n    for (int j = 0; j < V; ++j) xv.v[j] = "
                 "reinterpret_cast<const volatile T*>(x)[e + j];")], DROPOUT_OPS),
    PerfMutant("layer_norm.cu", "a row-major loop turned strided (lane owns packs lane * NV + k, not lane + 32 k)",
               [("lane + 32 * k", "lane * NV + k")], "layer_norm"),
    PerfMutant("column_sums.cuh", "the tile indexed column-major (16-way shared-memory bank conflicts)",
               [("[kSumGroups][kSumCols]);", "[kSumCols][kSumGroups]);"), ("s0[g][tc] = a0;", "s0[tc][g] = a0;"),
                ("s1[g][tc] = a1;", "s1[tc][g] = a1;"), ("t0 += s0[q][tc];", "t0 += s0[tc][q];"),
                ("t1 += s1[q][tc];", "t1 += s1[tc][q];")], "layer_norm"),
    PerfMutant("attention_heads.cu", "a block size that halves occupancy (the head split/merge in 32-thread "
               "blocks: 32 blocks, so 32 warps an SM)",
               [("constexpr int kVecThreads = 128;", "constexpr int kVecThreads = 32;")], "qkv_bias_split,merge_heads"),
    PerfMutant("layer_norm.cu", "a needless second read of an input (the forward reads x again for the output)",
               [("return (xf[k][j] - mu) * rs * unpack<T>(wv[k], j) + unpack<T>(bv[k], j);",
                 "const uint4 again = reinterpret_cast<const uint4*>(x + row * cols)[lane + 32 * k];\n"
                 "      return (unpack<T>(again, j) - mu) * rs * unpack<T>(wv[k], j) + unpack<T>(bv[k], j);")],
               "layer_norm"),
]

CHECKED = os.path.join(ROOT, "build/emulation-checked")
PLAIN = os.path.join(ROOT, "build/emulation")


def run_guard(lib: str, src_root: str, ops: str) -> Tuple[bool, str]:
    """(caught, by): whether the guard found the mutant (exit 1 with its findings) and its first finding."""
    env = dict(os.environ, FLS_CUDA_EMULATION="1", FLS_CUDA_EMULATION_LIBRARY=lib, FLS_EMULATION_CHECKS="0",
               FLS_KERNEL_PROFILE_SOURCES=src_root, OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-m", "scripts.kernel_profile.guard", "--ops", ops], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=1200)
    lines = [x for x in r.stdout.strip().splitlines() if x]
    if r.returncode == 1 and lines:
        return True, lines[0] + (f" (and {len(lines) - 1} more)" if len(lines) > 1 else "")
    # 0: passed; anything but its own finding (a crash, a build error) is not a catch either
    print(r.stderr[-2000:] if r.returncode not in (0, 1) else "", end="", file=sys.stderr)
    return False, ""


def main(only=None, json_path=None, jobs=2) -> int:
    if not os.path.exists(os.path.join(PLAIN, "csrc/emulation/scheduler.cpp.o")) or not os.path.isdir(CHECKED):
        print("cuda_mutants --perf: run `make emulated` first (the unmutated objects)", file=sys.stderr)
        return 2
    chosen = [(i + 1, m) for i, m in enumerate(PERF_MUTANTS) if not only or i + 1 in only]

    def check(src, m):
        lib = os.path.join(src, "lib", "_cuda_emulated_checked.so")
        os.makedirs(os.path.dirname(lib))
        build(src, lib, m.file, jobs, "checked")
        return run_guard(lib, src, m.ops)

    return run_mutants(chosen, "performance mutants", lambda m: (m.edits, -1), check, json_path)
