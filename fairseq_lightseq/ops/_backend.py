"""Loads the compiled library and decides, per op and device, whether its kernel can run.

`import fairseq_lightseq` never fails because the library is missing or lacks CUDA: the ops fall
back to the reference implementations and say so once (a warning naming the reason).
"""
import contextlib
import ctypes
import functools
import os
import warnings
from typing import Dict, Optional

import torch

NAMESPACE = "fairseq_lightseq"

# The emulated CUDA device (csrc/emulation/, a test build: `make emulated`): with FLS_CUDA_EMULATION=1 its
# library is loaded before _C, so that _C's CUDA implementations find the emulated kernel launchers, and
# emulated_cuda() runs them on CPU tensors. Never loaded otherwise. FLS_CUDA_EMULATION_LIBRARY names another
# build of it (scripts/cuda_mutants.py).
EMULATION_LIBRARY = os.environ.get("FLS_CUDA_EMULATION_LIBRARY") or os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "_cuda_emulated.so")
EMULATION_LOADED = False
_emulation_library = None  # its ctypes handle, when loaded
if os.environ.get("FLS_CUDA_EMULATION") == "1":
    if torch.version.cuda is not None:
        raise RuntimeError("FLS_CUDA_EMULATION=1: the emulated CUDA device is for a CPU build of torch; this torch "
                           f"has CUDA {torch.version.cuda}")
    if not os.path.exists(EMULATION_LIBRARY):
        raise RuntimeError(f"FLS_CUDA_EMULATION=1 but {EMULATION_LIBRARY} is missing: build it with `make emulated`")
    _emulation_library = ctypes.CDLL(EMULATION_LIBRARY, mode=ctypes.RTLD_GLOBAL)
    _emulation_library.fls_emu_launch_counts.restype = ctypes.c_char_p
    EMULATION_LOADED = True

try:
    from fairseq_lightseq import _C  # noqa: F401  (registers the ops)

    BUILD_INFO = dict(_C.build_info())
    LOAD_ERROR = None
except ImportError as e:  # not built, or built against another torch
    _C = None
    BUILD_INFO = {"with_cuda": False, "cuda_archs": "", "torch_version": "", "compiler": ""}
    LOAD_ERROR = e

LIBRARY_FILE = None if _C is None else _C.__file__  # the compiled library's path, None when not loaded

_warned = set()
_emulating = False
_NOT_LOADED = "the emulated CUDA device is not loaded: set FLS_CUDA_EMULATION=1 (after `make emulated`)"


@contextlib.contextmanager
def emulated_cuda(on: bool = True):
    """Within it, the ops run their CUDA implementations and kernels on CPU tensors, on the emulated device
    (needs FLS_CUDA_EMULATION=1 at import); fp16 then reaches the kernels on the CPU too. For tests;
    emulated_cuda(False) inside it runs the CPU kernels again (to compare the two)."""
    global _emulating
    if on and (_C is None or not EMULATION_LOADED):
        raise RuntimeError(_NOT_LOADED)
    before = _emulating
    if _C is not None and EMULATION_LOADED:
        _C.set_cuda_emulation(on)
    _emulating = on
    try:
        yield
    finally:
        if _C is not None and EMULATION_LOADED:
            _C.set_cuda_emulation(before)
        _emulating = before


def emulating() -> bool:
    """Whether the ops run on the emulated CUDA device now (see emulated_cuda)."""
    return _emulating


def _emulation():
    if _emulation_library is None:
        raise RuntimeError(_NOT_LOADED)
    return _emulation_library


def emulated_poison_byte() -> int:
    """The byte that the emulated device's poison repeats in memory no kernel wrote yet (shared memory, and every
    CPU allocation made while it is on): 0xff (NaN) or, with FLS_EMULATION_POISON=finite, 0x7b."""
    return _emulation().fls_emu_poison_byte()


def emulated_launches() -> Dict[str, int]:
    """{kernel name: launches} of every kernel the emulated device ran so far in this process (names as the
    emulator reports them, e.g. "fls::cuda::{anonymous}::ln_fwd_kernel<float>"). For tests that a run reached
    the emulated kernels rather than falling back to the CPU ones."""
    text = _emulation().fls_emu_launch_counts().decode()
    return {name: int(count) for name, count in (line.split("\t") for line in text.splitlines())}


def warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn("fairseq_lightseq: " + message, RuntimeWarning, stacklevel=3)


@functools.lru_cache(maxsize=None)
def has_kernel(op: str, device_type: str) -> bool:
    """Whether the compiled library registered op `op` for device type "cpu" or "cuda". Cached: the
    registrations are fixed once the library is loaded, and every op call asks."""
    if _C is None:
        return False
    key = {"cpu": "CPU", "cuda": "CUDA"}.get(device_type)
    if key is None:
        return False
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key(f"{NAMESPACE}::{op}", key)
    except RuntimeError:  # no such operator: this build does not have it
        return False


def use_kernel(op: str, device_type: str, dtype: Optional[torch.dtype] = None) -> bool:
    """True when `op` has a compiled kernel for this device (and `dtype`, the dtype of the op's main
    input, when given); otherwise warns once and returns False. The CPU kernels take fp32, fp64 and
    bf16: fp16 on the CPU (fairseq's --fp16 / --memory-efficient-fp16 with --cpu) runs the reference
    ops, which compute in fp32 and return fp16."""
    if dtype == torch.float16 and device_type == "cpu" and not _emulating:
        warn_once("cpu:float16", "no compiled CPU kernels for float16; using the reference ops (fp32 math)")
        return False
    if has_kernel(op, device_type):
        return True
    if _C is None:
        warn_once("load", f"compiled library not loaded ({LOAD_ERROR}); using the pure-PyTorch reference ops")
    else:
        warn_once(f"{op}:{device_type}", f"no compiled {device_type} kernel for {op}; using the reference op")
    return False


def registered_ops():
    """Names (without namespace) of every op the compiled library registered, sorted; empty when it is
    not loaded."""
    prefix = NAMESPACE + "::"
    return sorted(name[len(prefix):] for name in torch._C._dispatch_get_all_op_names() if name.startswith(prefix))


def ops():
    """torch.ops.fairseq_lightseq."""
    return getattr(torch.ops, NAMESPACE)


class _NoGradContext:
    """What a Function's forward may use of its ctx, for a call without autograd (see apply)."""

    def __init__(self, n_inputs: int):
        self.needs_input_grad = (False,) * n_inputs

    def save_for_backward(self, *tensors):
        pass

    def mark_non_differentiable(self, *tensors):
        pass

    def set_materialize_grads(self, value: bool):
        pass


def apply(function, *args):
    """function.apply(*args), or with grad mode off its forward alone: under no_grad (fairseq-generate,
    validation) autograd would record nothing anyway, and Function.apply costs a few us of Python per
    call, which a decoding step of small tensors pays for every op."""
    if torch.is_grad_enabled():
        return function.apply(*args)
    return function.forward(_NoGradContext(len(args)), *args)


def register_fake(op: str):
    """Decorator registering a shape function (fake/meta kernel) for `op` when the library is loaded,
    so that the op traces under torch.compile. A no-op otherwise."""
    def wrap(fn):
        if _C is not None:
            torch.library.register_fake(f"{NAMESPACE}::{op}")(fn)
        return fn
    return wrap


def autocast_on(t: torch.Tensor) -> bool:
    """Whether autocast (fairseq's --amp) is on for t's device. Only then do the ops accept mixed
    dtypes: a linear's output is fp16/bf16 there while biases, norm weights and the residual stream
    stay fp32. Outside autocast a dtype mismatch stays an error, as in PyTorch."""
    return torch.is_autocast_enabled(t.device.type)


def promote(*tensors: torch.Tensor):
    """The tensors cast to their common dtype (torch.promote_types), as PyTorch's own binary ops would
    do; the casts are differentiable."""
    dt = functools.reduce(torch.promote_types, (t.dtype for t in tensors))
    return tuple(t if t.dtype == dt else t.to(dt) for t in tensors)
