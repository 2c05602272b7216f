"""Attention over packed rows on torch's FlashAttention-2 varlen kernel (aten::_flash_attention_forward /
_flash_attention_backward, in every CUDA build of torch), with dropout, as one autograd Function.

Where it runs (`flash_problem`): CUDA, fp16/bf16, compute capability 8.0 or newer, head dim <= 256 and a
multiple of 8, and a torch whose two ops take the arguments this module passes. The schemas are checked
once, at import (`SCHEMA_PROBLEM`): the argument list and the returned tuple changed between torch releases
(the philox seed/offset pair became an rng_state tensor), and a call with a stale argument list would fail
mid-training or, worse, pass a tensor where another is meant. Everywhere else the packed attention runs our
kernel (ops.varlen_attention); `warn_fallback` says so once per reason, naming torch's version.

The Function keeps for backward what torch's own derivative of the op keeps: q, k, v, the output, the
log-sum-exp ([H, Nq] fp32) and the two rng-state tensors the forward returned (the philox seed and offset of
its dropout mask, on the device), which the backward takes as they are: nothing is read back to the host.
With `recompute` it keeps q, k, v only and backward reruns the forward for the output and log-sum-exp, with
the CUDA generator set back to the state it had before the forward (a host-side copy, taken without a sync),
so the rerun draws the forward's mask.

The dropout mask comes from torch's CUDA generator, not our Philox stream (as with SDPA on the padded path).
"""
import functools
from typing import NamedTuple, Optional

import torch
import torch._guards

from ._backend import warn_once

# The arguments this module passes (positionally, then `scale` by keyword) and the results it reads (the first
# four), written as torch declares them; `schema_problem` compares torch's declarations with these.
EXPECTED_FORWARD = (
    "aten::_flash_attention_forward(Tensor query, Tensor key, Tensor value, Tensor? cum_seq_q, Tensor? cum_seq_k, "
    "SymInt max_q, SymInt max_k, float dropout_p, bool is_causal, bool return_debug_mask, *, float? scale=None) "
    "-> (Tensor output, Tensor softmax_logsumexp, Tensor rng_state, Tensor unused, Tensor debug_attn_mask)")
EXPECTED_BACKWARD = (
    "aten::_flash_attention_backward(Tensor grad_out, Tensor query, Tensor key, Tensor value, Tensor out, "
    "Tensor logsumexp, Tensor cum_seq_q, Tensor cum_seq_k, SymInt max_q, SymInt max_k, float dropout_p, "
    "bool is_causal, Tensor rng_state, Tensor unused, *, float? scale=None) -> (Tensor, Tensor, Tensor)")

MIN_CAPABILITY = (8, 0)  # FlashAttention-2: Ampere or newer
MAX_HEAD_DIM = 256
FLASH_DTYPES = (torch.float16, torch.bfloat16)


def _type(arg) -> str:
    return str(arg.type).replace("SymInt", "int")


def schema_problem(forward_schema, backward_schema) -> Optional[str]:
    """Why torch's declared schemas (torch._C.FunctionSchema of the forward and backward op) do not take the
    call this module makes, or None when they do: the positional arguments we pass, in order and type; a
    keyword `scale` of the same type; every further argument with a default; as many results as expected
    (names of arguments and results may differ: they are passed and read by position)."""
    for actual, expected in ((forward_schema, torch._C.parse_schema(EXPECTED_FORWARD)),
                             (backward_schema, torch._C.parse_schema(EXPECTED_BACKWARD))):
        name = expected.name
        if actual is None:
            return f"{name} is missing"
        have = [a for a in actual.arguments if not a.kwarg_only]
        want = [a for a in expected.arguments if not a.kwarg_only]
        if len(have) < len(want):
            return f"{name} takes {len(have)} positional arguments, we pass {len(want)}"
        for i, (a, e) in enumerate(zip(have, want)):
            if _type(a) != _type(e):
                return f"{name}'s argument {i} ({a.name}) is {a.type}, we pass {e.type} ({e.name})"
        keywords = {a.name: a for a in actual.arguments if a.kwarg_only}
        for e in (a for a in expected.arguments if a.kwarg_only):
            if e.name not in keywords or _type(keywords[e.name]) != _type(e):
                return f"{name} has no keyword argument `{e.type} {e.name}`"
        passed = {a.name for a in expected.arguments if a.kwarg_only}
        extra = have[len(want):] + [a for a in keywords.values() if a.name not in passed]
        for a in extra:
            if not a.has_default_value():
                return f"{name} needs argument {a.name}, which we do not pass"
        if len(actual.returns) != len(expected.returns):
            return f"{name} returns {len(actual.returns)} tensors, we read {len(expected.returns)}"
    return None


def _torch_schemas():
    ops = torch.ops.aten
    try:
        return ops._flash_attention_forward.default._schema, ops._flash_attention_backward.default._schema
    except (AttributeError, RuntimeError):  # a torch without the ops
        return None, None


SCHEMA_PROBLEM = schema_problem(*_torch_schemas())


@functools.lru_cache(maxsize=None)
def _capability(index: int):
    return torch.cuda.get_device_capability(index)


def flash_problem(device: torch.device, dtype: torch.dtype, head_dim: int, capability=None) -> Optional[str]:
    """Why torch's flash varlen kernel cannot run attention over packed rows of this device, dtype and head dim
    (capability: the GPU's (major, minor), default: asked from torch for a CUDA device), or None when it can."""
    if SCHEMA_PROBLEM is not None:
        return f"the schema of torch's flash attention ops is not the one this plugin calls ({SCHEMA_PROBLEM})"
    if device.type != "cuda":
        return f"it runs on CUDA only, not on {device.type}"
    if dtype not in FLASH_DTYPES:
        return f"it takes fp16/bf16, not {str(dtype)[6:]}"
    if head_dim > MAX_HEAD_DIM or head_dim % 8:
        return f"head dim {head_dim} is not a multiple of 8 up to {MAX_HEAD_DIM}"
    if capability is None:
        capability = _capability(device.index if device.index is not None else torch.cuda.current_device())
    if tuple(capability) < MIN_CAPABILITY:
        return "it needs compute capability 8.0 or newer, this GPU has {}.{}".format(*capability)
    return None


def warn_fallback(reason: str) -> None:
    """One warning per reason: the packed attention runs our kernel instead of torch's flash varlen kernel."""
    warn_once(f"flash:{reason}", f"packed attention runs our varlen kernel, not torch {torch.__version__}'s flash "
                                 f"varlen attention: {reason}")


class FlashResult(NamedTuple):
    """What one flash forward returns and its backward takes: out [Nq, H, D] (q's dtype), lse [H, Nq] fp32,
    rng_state and unused: the philox state tensors of its dropout mask (on the device, as torch returns them)."""

    out: torch.Tensor
    lse: torch.Tensor
    rng_state: torch.Tensor
    unused: torch.Tensor


def flash_forward(q, k, v, cu_q, cu_k, max_q: int, max_k: int, p: float, causal: bool, scale: float) -> FlashResult:
    """torch's flash varlen forward. q: [Nq, H, D], k, v: [Nk, H, D] fp16/bf16 CUDA; cu_q, cu_k: int32 [B+1] on
    the device; max_q, max_k: host ints >= every length; p: attention-dropout probability (torch's generator)."""
    out, lse, rng_state, unused, _ = torch.ops.aten._flash_attention_forward(
        q, k, v, cu_q, cu_k, max_q, max_k, p, causal, False, scale=scale)
    return FlashResult(out, lse, rng_state, unused)


def flash_backward(dout, q, k, v, cu_q, cu_k, max_q: int, max_k: int, p: float, causal: bool, scale: float,
                   saved: FlashResult):
    """(dq, dk, dv) of flash_forward's call, given the FlashResult it returned (the same mask: its rng state)."""
    return torch.ops.aten._flash_attention_backward(
        dout.contiguous(), q, k, v, saved.out, saved.lse, cu_q, cu_k, max_q, max_k, p, causal, saved.rng_state,
        saved.unused, scale=scale)


def generator_state(device: torch.device, p: float):
    """The CUDA generator's state before a forward with dropout p, for `replay`; None where there is nothing to
    replay (p == 0) or no generator (tracing under fake tensors). A host copy: no sync."""
    if not p or torch._guards.detect_fake_mode() is not None:
        return None
    return _generator(device).get_state()


class replay:
    """Context: the CUDA generator of `device` set to `state` (generator_state's) inside, its own state after.
    `state` None: nothing is done."""

    def __init__(self, device: torch.device, state):
        self.device, self.state, self.now = device, state, None

    def __enter__(self):
        if self.state is not None:
            gen = _generator(self.device)
            self.now = gen.get_state()
            gen.set_state(self.state)

    def __exit__(self, *exc):
        if self.state is not None:
            _generator(self.device).set_state(self.now)


def _generator(device: torch.device):
    return torch.cuda.default_generators[device.index if device.index is not None else torch.cuda.current_device()]


class FlashVarlenAttentionFunction(torch.autograd.Function):
    """apply(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, p, recompute) -> out [Nq, H, D]."""

    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, p, recompute):
        state = generator_state(q.device, p) if recompute else None
        res = flash_forward(q, k, v, cu_q, cu_k, max_q, max_k, p, causal, scale)
        kept = () if recompute else tuple(res)
        ctx.save_for_backward(q, k, v, cu_q, cu_k, *kept)
        ctx.args = (max_q, max_k, p, causal, scale)
        ctx.rng = state
        return res.out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, cu_q, cu_k, *kept = ctx.saved_tensors
        if kept:
            res = FlashResult(*kept)
        else:
            with replay(q.device, ctx.rng):
                res = flash_forward(q, k, v, cu_q, cu_k, *ctx.args)
        dq, dk, dv = flash_backward(dout, q, k, v, cu_q, cu_k, *ctx.args, res)
        return (dq, dk, dv) + (None,) * 8


def flash_varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                           cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, causal: bool = False,
                           scale: Optional[float] = None, p: float = 0.0, recompute: bool = False) -> torch.Tensor:
    """ops.varlen_attention's problem on torch's flash kernel (where flash_problem is None). q: [Nq, H, D]; k, v:
    [Nk, H, D]; fp16/bf16 CUDA, one dtype; cu_seqlens_*: int32 [B+1] on q's device; max_seqlen_*: host ints;
    causal: query i of a sentence sees its keys j <= i (FlashAttention-2 aligns the band to the bottom right:
    j <= i + Lk - Lq, the same for Lq == Lk); scale: default D ** -0.5; p: attention-dropout probability, the mask
    from torch's CUDA generator. recompute: keep q, k, v only (backward reruns the forward, same mask).
    Returns [Nq, H, D], q's dtype."""
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    return FlashVarlenAttentionFunction.apply(q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q),
                                              int(max_seqlen_k), bool(causal), scale, float(p), bool(recompute))
