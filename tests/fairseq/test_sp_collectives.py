"""The sequence-parallel collectives and groups (fairseq_lightseq.sequence_parallel):

* in 2 and 4 gloo processes (one spawn per world size runs every check): forward values against the
  one-process concatenation/split of every rank's input, gradients of sum(w * out) against the
  routed weights, byte counts against the volume formulas, the SP groups;
* in this process: P = 1 (identity), torch's fake process group (rank 0 of P: shapes and counts, as
  the benchmark uses it), refusals.

Every rank draws every rank's inputs from the same seeds, so each can compute the expected values.
"""
import traceback

import pytest
import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

from fairseq_lightseq.sequence_parallel import collectives as C
from fairseq_lightseq.sequence_parallel.groups import TRIVIAL, new_sequence_parallel_group
from support import dist as dist_support
from support.tensors import TOL, randn

DTYPES = [torch.float64, torch.float32, torch.bfloat16, torch.float16]


class Expect:
    """Collects mismatches and raises them together at the end of a check, after all of its
    collectives: a rank that stopped early would leave the others waiting in one."""

    def __init__(self):
        self.errors = []

    def equal(self, actual, expected, what):
        if actual.shape != expected.shape or actual.dtype != expected.dtype or not torch.equal(actual, expected):
            self.errors.append(f"{what}: got {actual.dtype} {tuple(actual.shape)}, expected "
                               f"{expected.dtype} {tuple(expected.shape)} or other values")

    def close(self, actual, expected, what):
        rtol, atol = TOL[expected.dtype]
        try:
            torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol)
        except AssertionError as e:
            self.errors.append(f"{what}: {e}")

    def true(self, cond, what):
        if not cond:
            self.errors.append(what)

    def check(self):
        assert not self.errors, "\n".join(self.errors)


def per_rank(shape, dtype, seed, P):
    """Rank p's tensor for p in 0..P-1 (the same on every rank)."""
    return [randn(*shape, dtype=dtype, seed=seed * 100 + p) for p in range(P)]


def noncontiguous(x):
    """A copy of x with the same values and its first and last dims' strides swapped."""
    y = x.transpose(0, -1).contiguous().transpose(0, -1)
    assert not y.is_contiguous()
    return y


# (shape, scatter_dim, gather_dim) with P = the world size; T/P = 2, B = 3, H = 2P, hd = 5.
def a2a_cases(P):
    return [((2, 3, 3, 2 * P, 5), 3, 0),  # ulysses: packed QKV [T/P,B,3,H,hd] -> [T,B,3,H/P,hd]
            ((2 * P, 3, 2, 5), 0, 2),  # and its output back: [T,B,H/P,hd] -> [T/P,B,H,hd]
            ((4, 2 * P), -1, -2),  # negative dims
            ((2 * P, 3), 0, 0)]  # the same dim: the chunks permuted


def check_all_to_all(rank, P):
    ex = Expect()
    for i, (shape, s, g) in enumerate(a2a_cases(P)):
        for dtype, transposed in [(dt, False) for dt in DTYPES] + [(torch.float32, True)]:
            what = f"all_to_all {shape} s={s} g={g} {dtype} transposed={transposed}"
            xs = per_rank(shape, dtype, 10 + i, P)
            x = xs[rank]
            x = (noncontiguous(x) if transposed else x.clone()).requires_grad_()
            out = C.all_to_all(x, s, g, None)
            expected = torch.cat([xp.chunk(P, s)[rank] for xp in xs], dim=g)
            ex.equal(out, expected, what + " forward")
            ws = per_rank(expected.shape, dtype, 20 + i, P)
            (out * ws[rank]).sum().backward()
            # rank p's output holds chunk `rank` (along g) of what this rank sent as chunk p
            ex.equal(x.grad, torch.cat([w.chunk(P, g)[rank] for w in ws], dim=s), what + " backward")
    # double backward: the gradient is itself an all_to_all of the weights (which get the inputs back)
    shape, s, g = a2a_cases(P)[0]
    xs = per_rank(shape, torch.float64, 30, P)
    x = xs[rank].clone().requires_grad_()
    out = C.all_to_all(x, s, g, None)
    ws = per_rank(out.shape, torch.float64, 31, P)
    w = ws[rank].clone().requires_grad_()
    (grad,) = torch.autograd.grad(out, x, w, create_graph=True)
    vs = per_rank(shape, torch.float64, 32, P)
    (grad * vs[rank]).sum().backward()
    ex.equal(w.grad, torch.cat([v.chunk(P, s)[rank] for v in vs], dim=g), "all_to_all double backward")
    ex.check()


def check_all_gather_reduce_scatter(rank, P):
    ex = Expect()
    for dim, shape in ((0, (2, 3, 4)), (1, (3, 2, 5)), (-1, (2, 2, 3))):
        for dtype in DTYPES:
            what = f"dim={dim} {shape} {dtype}"
            xs = per_rank(shape, dtype, 40, P)
            x = noncontiguous(xs[rank]) if dtype == torch.float32 else xs[rank].clone()
            x.requires_grad_()
            out = C.all_gather(x, dim, None)
            ex.equal(out, torch.cat(xs, dim=dim), "all_gather forward " + what)
            ws = per_rank(out.shape, dtype, 41, P)
            (out * ws[rank]).sum().backward()
            expected = torch.stack([w.chunk(P, dim)[rank] for w in ws]).double().sum(0).to(dtype)
            ex.close(x.grad, expected, "all_gather backward (sum over ranks of chunk rank) " + what)

            big = list(shape)
            big[dim] *= P
            ys = per_rank(big, dtype, 42, P)
            y = noncontiguous(ys[rank]) if dtype == torch.float32 else ys[rank].clone()
            y.requires_grad_()
            out = C.reduce_scatter(y, dim, None)
            expected = torch.stack([yp.chunk(P, dim)[rank] for yp in ys]).double().sum(0).to(dtype)
            ex.close(out, expected, "reduce_scatter forward " + what)
            ws = per_rank(out.shape, dtype, 43, P)
            (out * ws[rank]).sum().backward()
            ex.equal(y.grad, torch.cat(ws, dim=dim), "reduce_scatter backward (all_gather) " + what)
    ex.check()


def ulysses_layer(P, dtype, group):
    """One self-attention layer's exchanges in ulysses mode, forward and backward (attention itself
    replaced by a sum over Q, K, V): T = 2P, B = 3, H = 2P heads of 4, E = H*4. Returns N*E."""
    T, B, H, hd = 2 * P, 3, 2 * P, 4
    qkv = randn(T // P, B, 3, H, hd, dtype=dtype, seed=50, requires_grad=True)
    heads = C.all_to_all(qkv, 3, 0, group)  # [T, B, 3, H/P, hd]
    out = C.all_to_all(heads.sum(2), 0, 2, group)  # [T/P, B, H, hd]
    (out * randn(*out.shape, dtype=dtype, seed=51)).sum().backward()
    return T * B * H * hd


def allgather_layer(P, dtype, group):
    """allgather mode: this rank's K and V rows [T/P, B, E] gathered to [T, B, E] each, forward and
    backward. Returns N*E."""
    T, B, E = 2 * P, 3, 8
    total = 0
    for seed in (60, 61):
        kv = randn(T // P, B, E, dtype=dtype, seed=seed, requires_grad=True)
        full = C.all_gather(kv, 0, group)
        total = total + (full * randn(*full.shape, dtype=dtype, seed=seed + 10)).sum()
    total.backward()
    return T * B * E


def check_bytes(rank, P):
    ex = Expect()
    for dtype in (torch.float32, torch.bfloat16):
        size = torch.tensor([], dtype=dtype).element_size()
        C.reset_bytes()
        NE = ulysses_layer(P, dtype, None)
        volume = 4 * NE * (P - 1) // P**2 * size  # 4NE(P-1)/P^2 elements (docs/usage.md)
        ex.true(dict(C.BYTES) == {("forward", "all_to_all"): volume, ("backward", "all_to_all"): volume},
                f"ulysses {dtype}: {dict(C.BYTES)}, expected {volume} forward and backward")
        C.reset_bytes()
        NE = allgather_layer(P, dtype, None)
        volume = 2 * NE * (P - 1) // P * size  # 2NE(P-1)/P
        ex.true(C.bytes_sent("forward") == C.bytes_sent("forward", "all_gather") == volume
                and C.bytes_sent("backward") == C.bytes_sent("backward", "reduce_scatter") == volume
                and C.bytes_sent() == 2 * volume,
                f"allgather {dtype}: {dict(C.BYTES)}, expected {volume} forward and backward")
    ex.check()


def check_groups(rank, W):
    ex = Expect()
    for P in [p for p in (1, 2, 4) if W % p == 0]:
        sp = new_sequence_parallel_group(P)
        ex.true(sp[1:] == (P, rank % P, rank // P, W // P), f"P={P}: {sp}")
        block = list(range(sp.index * P, (sp.index + 1) * P))
        ex.true(dist.get_process_group_ranks(sp.group) == block, f"P={P}: group ranks {block}")
        ex.true(new_sequence_parallel_group(P) is sp, f"P={P}: not cached")
        ids = C.all_gather(torch.tensor([float(rank)]), 0, sp.group)
        ex.true(ids.tolist() == [float(r) for r in block], f"P={P}: gathered {ids.tolist()}")
        C.reset_bytes()
        x = torch.randn(3, P)
        ex.true(P > 1 or (C.all_to_all(x, 1, 0, sp.group) is x and C.bytes_sent() == 0), "P=1: no identity")
        if P > 1:  # refused before anything is sent
            try:
                C.all_to_all(torch.randn(3, P + 1), 1, 0, sp.group)
                ex.true(False, f"P={P}: all_to_all of size {P + 1} accepted")
            except ValueError as e:
                ex.true("scatter_dim 1" in str(e) and f"P={P}" in str(e), str(e))
    for bad in (3, 2 * W):
        try:
            new_sequence_parallel_group(bad)
            ex.true(False, f"size {bad} accepted in a world of {W}")
        except ValueError as e:
            ex.true(f"--sequence-parallel-size {bad}" in str(e) and f"world size {W}" in str(e), str(e))
    ex.check()


CHECKS = {f.__name__[6:]: f for f in (check_all_to_all, check_all_gather_reduce_scatter, check_bytes, check_groups)}


def run_checks():
    """In each rank: every check, in order; name -> None or the failure's traceback."""
    rank, world = dist.get_rank(), dist.get_world_size()
    outcome = {}
    for name, check in CHECKS.items():
        try:
            check(rank, world)
            outcome[name] = None
        except Exception:
            outcome[name] = traceback.format_exc()
    return outcome


@pytest.fixture(scope="module", params=[2, 4], ids=lambda w: f"W{w}")
def gloo_outcomes(request):
    return dist_support.run(run_checks, request.param)


@pytest.mark.parametrize("check", list(CHECKS))
def test_gloo(gloo_outcomes, check):
    failures = [f"rank {r}:\n{o[check]}" for r, o in enumerate(gloo_outcomes) if o[check] is not None]
    assert not failures, "\n".join(failures)


def fail_on_rank_1():
    if dist.get_rank() == 1:
        raise ValueError("rank 1 stops")
    dist.barrier()  # rank 0 waits for rank 1 forever


def test_runner_reports_a_failing_rank():
    with pytest.raises(RuntimeError, match="(?s)rank 1 of 2 failed.*ValueError: rank 1 stops"):
        dist_support.run(fail_on_rank_1, 2, timeout=60)


# ---- in this process ----

def test_without_distributed_size_1_is_the_identity():
    assert not dist.is_initialized()
    x = torch.randn(4, 6)
    C.reset_bytes()
    assert C.all_to_all(x, 1, 0, None) is x and C.all_gather(x, 0) is x and C.reduce_scatter(x, 1) is x
    assert C.bytes_sent() == 0
    assert new_sequence_parallel_group(1) is TRIVIAL
    assert TRIVIAL == (None, 1, 0, 0, 1)
    for bad in (2, 0, -1, 1.0, True):
        with pytest.raises(ValueError, match="--sequence-parallel-size"):
            new_sequence_parallel_group(bad)


@pytest.fixture
def fake_world():
    """init(P): this process as rank 0 of a fake world of P (collectives allocate, send nothing)."""
    yield lambda P: dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=P)
    dist.destroy_process_group()


@pytest.mark.parametrize("P", [2, 8])
def test_fake_process_group_shapes_and_counts(fake_world, P):
    fake_world(P)
    sp = new_sequence_parallel_group(P)
    assert sp[1:] == (P, 0, 0, 1) and dist.get_world_size(sp.group) == P
    for layer, factor in ((ulysses_layer, 4 * (P - 1) / P**2), (allgather_layer, 2 * (P - 1) / P)):
        C.reset_bytes()
        NE = layer(P, torch.bfloat16, sp.group)
        assert C.bytes_sent("forward") == C.bytes_sent("backward") == NE * factor * 2, (layer, dict(C.BYTES))
    T, B, H, hd = 4 * P, 2, 2 * P, 3
    x = torch.randn(T // P, B, 3, H, hd, requires_grad=True)
    y = C.all_to_all(x, 3, 0, sp.group)
    assert y.shape == (T, B, 3, H // P, hd)
    g = C.all_gather(x, 0, sp.group)
    assert g.shape == (T, B, 3, H, hd)
    r = C.reduce_scatter(g, 3, sp.group)
    assert r.shape == (T, B, 3, H // P, hd)
    (y.sum() + g.sum() + r.sum()).backward()
    assert x.grad.shape == x.shape


def test_refusals(fake_world):
    fake_world(4)
    x = torch.randn(6, 3, 5)
    with pytest.raises(ValueError,
                       match=r"size 3 of scatter_dim 1 \(shape \(6, 3, 5\)\) is not divisible by the group size P=4"):
        C.all_to_all(x, 1, 0, None)
    with pytest.raises(ValueError, match=r"size 5 of dim 2 .* P=4"):
        C.reduce_scatter(x, -1, None)
    with pytest.raises(ValueError, match="gather_dim 3 is out of range"):
        C.all_to_all(torch.randn(4, 4, 4), 0, 3, None)
    with pytest.raises(ValueError, match="--sequence-parallel-size 3 must divide the world size 4"):
        new_sequence_parallel_group(3)
