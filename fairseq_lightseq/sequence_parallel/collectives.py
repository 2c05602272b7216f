"""Differentiable collectives over a process group of P ranks, and a count of the bytes they send.

Each function takes a tensor of any dtype (float64/32, fp16, bf16 on gloo and NCCL), contiguous or
not, and returns a new contiguous tensor; `group` is a torch.distributed process group (None: the
default group). With P = 1 (a group of one rank, or group None without torch.distributed) each is
the identity and sends nothing.

    all_to_all(x, scatter_dim, gather_dim, group)   x [.., P*n (scatter), .., m (gather), ..]
                                                    -> [.., n, .., P*m, ..]
    all_gather(x, dim, group)                       x [.., n, ..] -> [.., P*n, ..]
    reduce_scatter(x, dim, group)                   x [.., P*n, ..] -> [.., n, ..]  (sum over ranks)

The backward of each is its transpose: all_to_all with the dims swapped, reduce-scatter for
all-gather and all-gather for reduce-scatter; they are differentiable again (double backward).

Byte count: `BYTES[(direction, op)]` adds, per call, the bytes this rank sends under the optimal
algorithm, whatever the backend does inside (gloo's ring, NCCL's, or nothing on torch's fake process
group, where the count is what a real group would send):

    all_to_all      (P-1)/P of its input    (the chunk for itself stays)
    all_gather      (P-1) x its input       (its chunk to each other rank)
    reduce_scatter  (P-1)/P of its input    (the partial sum of each other rank's chunk)

`direction` is "forward" for calls in a forward pass (a recomputation under activation checkpointing
is another forward) and "backward" for the calls that compute gradients; `op` is the collective
that ran ("all_to_all", "all_gather", "reduce_scatter"), so the backward of all_gather counts as
("backward", "reduce_scatter"). The counts are Python integers: counting never syncs a device.
"""
from collections import Counter
from typing import Optional

import torch
import torch.distributed as dist

BYTES: Counter = Counter()

# torch 2.13 renamed the tensor forms of all-gather and reduce-scatter (the old names warn); gloo,
# NCCL and the fake process group implement them directly, as they do all_to_all_single.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def reset_bytes() -> None:
    """Forget every count."""
    BYTES.clear()


def bytes_sent(direction: Optional[str] = None, op: Optional[str] = None) -> int:
    """Bytes this rank sent since the last reset_bytes(), in `direction` ("forward"/"backward") and by
    `op` ("all_to_all"/"all_gather"/"reduce_scatter"); None counts all."""
    return sum(n for (d, o), n in BYTES.items() if direction in (None, d) and op in (None, o))


def group_size(group) -> int:
    """P, the number of ranks of `group` (None: the default group; 1 without torch.distributed)."""
    if group is None and not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size(group)


def _count(direction: str, op: str, nbytes: int) -> None:
    BYTES[(direction, op)] += nbytes


def _split_dim(x: torch.Tensor, dim: int, P: int) -> torch.Tensor:
    """x [.., P*n (dim), ..] -> contiguous [P, .., n, ..]: chunk p of x along dim, at index p."""
    return x.unflatten(dim, (P, x.shape[dim] // P)).movedim(dim, 0).contiguous()


def _join_dim(chunks: torch.Tensor, dim: int) -> torch.Tensor:
    """chunks [P, .., n (dim), ..] -> [.., P*n, ..]: the concatenation of chunks[0..P-1] along dim."""
    return chunks.movedim(0, dim).flatten(dim, dim + 1).contiguous()


def _norm_dim(x: torch.Tensor, dim: int, fn: str, arg: str) -> int:
    if not -x.dim() <= dim < x.dim():
        raise ValueError(f"{fn}: {arg} {dim} is out of range for a tensor of shape {tuple(x.shape)}")
    return dim % x.dim()


def _check_divisible(x: torch.Tensor, dim: int, P: int, fn: str, arg: str) -> None:
    if x.shape[dim] % P:
        raise ValueError(f"{fn}: size {x.shape[dim]} of {arg} {dim} (shape {tuple(x.shape)}) "
                         f"is not divisible by the group size P={P}")


def _all_to_all(x, scatter_dim, gather_dim, group, direction):
    P = group_size(group)
    send = _split_dim(x, scatter_dim, P)
    recv = torch.empty_like(send)
    # Equal splits: send[p] goes to rank p, recv[p] comes from rank p.
    dist.all_to_all_single(recv, send, group=group)
    _count(direction, "all_to_all", send.numel() * send.element_size() // P * (P - 1))
    return _join_dim(recv, gather_dim)


def _all_gather(x, dim, group, direction):
    P = group_size(group)
    recv = x.new_empty((P,) + tuple(x.shape))
    # flat views: every backend takes the concatenation of 1-d tensors (gloo refuses the stack form)
    _all_gather_single(recv.view(-1), x.reshape(-1), group=group)  # recv[p] = x of rank p
    _count(direction, "all_gather", x.numel() * x.element_size() * (P - 1))
    return _join_dim(recv, dim)


def _reduce_scatter(x, dim, group, direction):
    P = group_size(group)
    send = _split_dim(x, dim, P)
    recv = send.new_empty(send.shape[1:])
    _reduce_scatter_single(recv.view(-1), send.view(-1), group=group)  # rank r: sum over ranks of send[r]
    _count(direction, "reduce_scatter", send.numel() * send.element_size() // P * (P - 1))
    return recv


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scatter_dim, gather_dim, group, direction):
        ctx.args = (scatter_dim, gather_dim, group)
        return _all_to_all(x, scatter_dim, gather_dim, group, direction)

    @staticmethod
    def backward(ctx, grad):
        scatter_dim, gather_dim, group = ctx.args
        return _AllToAll.apply(grad, gather_dim, scatter_dim, group, "backward"), None, None, None, None


class _GatherOrScatter(torch.autograd.Function):
    """all_gather (gather=True) or reduce_scatter (gather=False): each is the other's backward."""

    @staticmethod
    def forward(ctx, x, dim, group, direction, gather):
        ctx.args = (dim, group, gather)
        return (_all_gather if gather else _reduce_scatter)(x, dim, group, direction)

    @staticmethod
    def backward(ctx, grad):
        dim, group, gather = ctx.args
        return _GatherOrScatter.apply(grad, dim, group, "backward", not gather), None, None, None, None


def all_to_all(x: torch.Tensor, scatter_dim: int, gather_dim: int, group=None) -> torch.Tensor:
    """Splits x into P equal chunks along scatter_dim, sends chunk p to rank p, and concatenates the
    chunks received from ranks 0..P-1 along gather_dim.

    x: [.., P*n (scatter_dim), .., m (gather_dim), ..] -> [.., n, .., P*m, ..], same dtype/device.
    E.g. ulysses attention: packed QKV [T/P, B, 3, H, hd] with scatter_dim=3, gather_dim=0 gives
    [T, B, 3, H/P, hd] (every time step, this rank's heads); the output [T, B, H/P, hd] goes back
    with scatter_dim=0, gather_dim=2. ValueError if x.shape[scatter_dim] is not a multiple of P.
    """
    scatter_dim = _norm_dim(x, scatter_dim, "all_to_all", "scatter_dim")
    gather_dim = _norm_dim(x, gather_dim, "all_to_all", "gather_dim")
    P = group_size(group)
    if P == 1:
        return x
    _check_divisible(x, scatter_dim, P, "all_to_all", "scatter_dim")
    return _AllToAll.apply(x, scatter_dim, gather_dim, group, "forward")


def all_gather(x: torch.Tensor, dim: int, group=None) -> torch.Tensor:
    """The concatenation along dim of x from ranks 0..P-1 (every rank's x has the same shape).

    x: [.., n (dim), ..] -> [.., P*n, ..]. Backward: the gradient summed over the ranks, of which
    rank r keeps chunk r (reduce_scatter). E.g. allgather attention: each rank's K/V rows [N/P, E]
    -> [N, E].
    """
    dim = _norm_dim(x, dim, "all_gather", "dim")
    if group_size(group) == 1:
        return x
    return _GatherOrScatter.apply(x, dim, group, "forward", True)


def reduce_scatter(x: torch.Tensor, dim: int, group=None) -> torch.Tensor:
    """Sum of x over ranks 0..P-1, of which rank r keeps chunk r along dim.

    x: [.., P*n (dim), ..] -> [.., n, ..]. Backward: all_gather of the gradient along dim.
    ValueError if x.shape[dim] is not a multiple of P.
    """
    dim = _norm_dim(x, dim, "reduce_scatter", "dim")
    P = group_size(group)
    if P == 1:
        return x
    _check_divisible(x, dim, P, "reduce_scatter", "dim")
    return _GatherOrScatter.apply(x, dim, group, "forward", False)
