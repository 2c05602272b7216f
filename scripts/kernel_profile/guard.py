"""The CI guard of the kernel profile: every op of scripts/bench_ops.py (the loss and the Adam step included) at a
small shape on the emulated device's checked build, each kernel's sector efficiency, worst shared-memory bank
conflict and theoretical occupancy, and each op's traffic ratio, against the floors recorded in
csrc/cuda/profile_floors.json; and no kernel spilling registers (ptxas, sm_90 and sm_80).

    python -m scripts.kernel_profile.guard [--ops A,B]   check (exit 1 naming each kernel below its floor)
    python -m scripts.kernel_profile.guard --write       record today's figures of every op as the floors

A change that makes a kernel better rewrites the floors with --write (the diff shows what improved); one that
makes it worse fails tests/ops/test_kernel_profile_guard.py, and `python -m scripts.cuda_mutants --perf`
proves that it would. FLS_KERNEL_PROFILE_SOURCES names another source tree for ptxas (the mutants').
"""
import json
import os
import sys
from typing import List

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FLOORS = os.path.join(ROOT, "csrc", "cuda", "profile_floors.json")
SHAPE, SEQUENCES, DTYPE = "big", 1, "fp16"  # Transformer-big widths: the fast paths' largest instances
SLACK = 0.01  # the figures are exact counts; the slack only absorbs rounding in the file


def template(kernel: str) -> str:
    return kernel.split("<")[0]


def measure(ops=None) -> dict:
    """{"kernels": {template: worst figures over its launches}, "ops": {op: {pass: traffic ratio}}} at the
    guard's shape, on the loaded emulated library (which must be the checked build); `ops`: only those."""
    import torch

    from scripts import bench_ops
    from scripts.kernel_profile import launches as launches_mod
    from scripts.kernel_profile import resources as res
    from scripts.kernel_profile.report import kernel_row

    s = bench_ops.SHAPES[SHAPE]
    small = launches_mod.reduced(s, SEQUENCES)
    ideal = bench_ops.ideal_bytes(small, 2)
    try:
        table = res.resources(root=os.environ.get("FLS_KERNEL_PROFILE_SOURCES", ROOT))
    except FileNotFoundError:  # no nvcc (make cuda-check says SKIP too): no occupancy to check
        table = {}
    kernels, traffic = {}, {}
    for op, passes in launches_mod.op_launches(s, torch.float16, ops, sequences=SEQUENCES).items():
        for i, (p, ls) in enumerate(passes.items()):  # ideal_bytes' order: fwd, bwd; or the one step
            rows = [kernel_row(x, table) for x in ls]
            if any(not r["observed"] for r in rows):
                raise RuntimeError("the loaded emulated library observes no accesses: load the checked build "
                                   "(FLS_CUDA_EMULATION_LIBRARY=fairseq_lightseq/_cuda_emulated_checked.so)")
            sector = sum(r["sector_bytes"] for r in rows)
            traffic.setdefault(op, {})[p] = round(sector / ideal[op][i], 3)
            for r in rows:
                k = kernels.setdefault(template(r["kernel"]), {})
                if r["sector_efficiency"] is not None:
                    k["sector_efficiency"] = round(min(k.get("sector_efficiency", 1.0), r["sector_efficiency"]), 3)
                if r["worst_bank_conflict"]:
                    k["bank_conflict"] = max(k.get("bank_conflict", 1.0), r["worst_bank_conflict"])
                if r.get("sm_90"):
                    k["occupancy_sm_90"] = min(k.get("occupancy_sm_90", 1.0), r["sm_90"]["occupancy"])
    return dict(kernels=kernels, ops=traffic)


def compare(floors: dict, now: dict) -> List[str]:
    """Each figure worse than its floor, and each kernel or op with no floor, as a line."""
    out = []
    for name, got in sorted(now["kernels"].items()):
        f = floors["kernels"].get(name)
        if f is None:
            out.append(f"{name}: no floor in csrc/cuda/profile_floors.json (record it: python -m "
                       "scripts.kernel_profile.guard --write)")
            continue
        for key, value in got.items():
            floor = f.get(key)
            if floor is None:
                out.append(f"{name}: {key} {value} has no floor")
            elif key == "bank_conflict" and value > floor + SLACK:
                out.append(f"{name}: {value:.0f}-way shared-memory bank conflict, at most {floor:.0f}-way recorded")
            elif key != "bank_conflict" and value < floor - SLACK:
                out.append(f"{name}: {key} {value:.3f} below its floor {floor:.3f}")
    for op, passes in sorted(now["ops"].items()):
        for p, ratio in passes.items():
            ceiling = floors["ops"].get(op, {}).get(p)
            if ceiling is None:
                out.append(f"{op} {p}: traffic ratio {ratio} has no ceiling")
            elif ratio > ceiling + SLACK:
                out.append(f"{op} {p}: moves {ratio:.3f}x its ideal bytes, at most {ceiling:.3f}x recorded")
    return out


def spills(root: str = ROOT) -> List[str]:
    from scripts.kernel_profile import resources as res

    return res.spills(res.resources(root=root))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ops = argv[argv.index("--ops") + 1].split(",") if "--ops" in argv else None
    now = measure(None if "--write" in argv else ops)  # the floors are of every op
    if "--write" in argv:
        doc = {"about": "the kernel profile's floors (scripts/kernel_profile/guard.py; rewrite with --write): per "
                        "kernel template the worst sector efficiency, theoretical occupancy on sm_90 and shared-memory "
                        "bank conflict of its launches, per op and pass the traffic ratio (sector bytes over ideal "
                        f"bytes), at bench_ops' {SHAPE} widths over {SEQUENCES} sequence(s), {DTYPE}, on the "
                        "emulated device's checked build"}
        doc.update(now)
        with open(FLOORS, "w") as f:
            json.dump(doc, f, indent=1, sort_keys=True)
            f.write("\n")
        print(f"wrote {os.path.relpath(FLOORS, ROOT)}")
        return 0
    with open(FLOORS) as f:
        failures = compare(json.load(f), now) + spills(os.environ.get("FLS_KERNEL_PROFILE_SOURCES", ROOT))
    print("\n".join(failures) or "every kernel at or above its floor, none spills")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
