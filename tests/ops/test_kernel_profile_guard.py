"""The kernel profile's CI guard (scripts/kernel_profile/guard.py): every op of bench_ops at Transformer-big widths
over one sequence, fp16, on the emulated device's checked build (whose kernels' accesses are observed): each
kernel's sector efficiency, shared-memory bank conflicts and theoretical occupancy (sm_90), and each op's
traffic against its ideal bytes, no worse than recorded in csrc/cuda/profile_floors.json; and no kernel spills
registers (ptxas, sm_90 and sm_80). `make test-cuda-emulated` runs this file once, in its own pass on the
checked build (FLS_KERNEL_PROFILE_GUARD=1); `python -m scripts.cuda_mutants --perf` proves it catches slow kernels.
"""
import json
import os

import pytest

from scripts.kernel_profile import guard

ON = os.environ.get("FLS_KERNEL_PROFILE_GUARD") == "1"
guard_pass = pytest.mark.skipif(not ON, reason="the checked build's pass of make test-cuda-emulated runs the guard")


@pytest.mark.cuda_emulated
@guard_pass
def test_every_kernel_at_or_above_its_floor():
    with open(guard.FLOORS) as f:
        floors = json.load(f)
    assert guard.compare(floors, guard.measure()) == []


@pytest.mark.cuda_emulated
@guard_pass
def test_no_kernel_spills_registers():
    try:
        found = guard.spills()
    except FileNotFoundError as e:  # no nvcc: make cuda-check says SKIP too
        pytest.skip(str(e))
    assert found == []


def test_compare_names_each_figure_below_its_floor():
    floors = {"kernels": {"k": {"sector_efficiency": 0.9, "occupancy_sm_90": 0.5, "bank_conflict": 1}},
              "ops": {"op": {"fwd": 1.0}}}
    ok = {"kernels": {"k": {"sector_efficiency": 0.95, "occupancy_sm_90": 0.5, "bank_conflict": 1}},
          "ops": {"op": {"fwd": 1.0}}}
    assert guard.compare(floors, ok) == []
    bad = {"kernels": {"k": {"sector_efficiency": 0.25, "occupancy_sm_90": 0.25, "bank_conflict": 16},
                       "new": {"sector_efficiency": 1.0}},
           "ops": {"op": {"fwd": 2.0, "bwd": 1.0}}}
    got = guard.compare(floors, bad)
    assert any("k: sector_efficiency 0.250 below its floor 0.900" in x for x in got)
    assert any("k: occupancy_sm_90 0.250 below" in x for x in got)
    assert any("16-way" in x for x in got)
    assert any(x.startswith("new: no floor") for x in got)
    assert any("op fwd: moves 2.000x" in x for x in got) and any("op bwd" in x and "no ceiling" in x for x in got)
