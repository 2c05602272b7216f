"""The kernel launches of each op of scripts/bench_ops.py (its cases with elsewhere=True: the loss and the Adam step
too), forward and backward (the Adam step: its one pass, "step"), as the launchers make them:
the ops run on the emulated CUDA device, whose profile observer (csrc/emulation/profile.cpp) writes every launch
(kernel instance, grid, block, dynamic shared memory and, in the checked build, its memory requests) to
FLS_EMULATION_PROFILE.

The emulated device runs a kernel on one CPU core, so the ops run at their shape's widths (hidden, ffn, heads,
sequence length, vocabulary: what picks the kernel instance and its block) over `sequences` sequences instead
of the shape's token count, and the Adam step over one encoder layer's parameters instead of the model's. The
block and shared memory of a launch, and so its occupancy, do not depend on the token count or the parameter
count; the grid does (the grids reported are those of the reduced shape).
Needs FLS_CUDA_EMULATION=1 set before fairseq_lightseq is imported, and `make emulated`; the requests need the
checked build (FLS_CUDA_EMULATION_LIBRARY=fairseq_lightseq/_cuda_emulated_checked.so).
"""
import json
import os
import tempfile
from typing import Dict, List, NamedTuple, Tuple

from scripts import bench_ops


class Launch(NamedTuple):
    kernel: str  # the instance, e.g. 'ln_fwd_warp_kernel<__half, 4>' (scripts.kernel_profile.resources.short_name)
    grid: Tuple[int, int, int]
    block: Tuple[int, int, int]
    smem: int  # dynamic shared memory, bytes
    traffic: dict  # the observer's line: "global" and "shared" totals, "unique_bytes", "sites", "observed"

    @property
    def threads(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]

    @property
    def blocks(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]


def parse_profile(text: str) -> List[Launch]:
    """The launches of FLS_EMULATION_PROFILE's lines."""
    from scripts.kernel_profile.resources import short_name

    out = []
    for line in text.splitlines():
        d = json.loads(line)
        out.append(Launch(short_name(d["kernel"]), tuple(d["grid"]), tuple(d["block"]), d["dynamic_smem"], d))
    return out


def recorded(fn) -> List[Launch]:
    """The launches fn() makes on the emulated device."""
    fd, path = tempfile.mkstemp(prefix="fls-profile-", suffix=".jsonl")
    os.close(fd)
    old = os.environ.get("FLS_EMULATION_PROFILE")
    os.environ["FLS_EMULATION_PROFILE"] = path
    try:
        fn()
        with open(path) as f:
            return parse_profile(f.read())
    finally:
        os.unlink(path)
        if old is None:
            del os.environ["FLS_EMULATION_PROFILE"]
        else:
            os.environ["FLS_EMULATION_PROFILE"] = old


def reduced(shape: dict, sequences: int) -> dict:
    """The shape with `sequences` sequences of its length instead of its token count, and the Adam step's sample
    of its parameters (one encoder layer's: bench_ops.adam_shapes)."""
    return dict(shape, tokens=min(shape["tokens"], sequences * shape["seq"]), adam_sample=True)


def op_launches(shape: dict, dtype, ops=None, sequences: int = 2) -> Dict[str, Dict[str, List[Launch]]]:
    """{op: {"fwd": [Launch], "bwd": [Launch]}} of bench_ops' cases (elsewhere=True) at `shape` over `sequences`
    sequences, on the emulated device (dtype a torch dtype); {"step": [Launch]} for an op without a backward."""
    import torch

    from fairseq_lightseq.ops import emulated_cuda

    out = {}
    with emulated_cuda():
        for name, inputs, grad_out, ours, _ref, _comp, _bf, _bb in bench_ops.cases(reduced(shape, sequences), "cpu",
                                                                                  dtype, elsewhere=True):
            if ops and name not in ops:
                continue
            if grad_out is None:
                out[name] = {"step": recorded(lambda: ours(*inputs))}
                continue
            box = {}
            fwd = recorded(lambda: box.setdefault("y", ours(*inputs)))
            leaves = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
            bwd = recorded(lambda: torch.autograd.grad(box["y"], leaves, grad_out))
            out[name] = {"fwd": fwd, "bwd": bwd}
    return out

