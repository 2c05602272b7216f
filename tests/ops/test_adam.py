"""adam_step: the fused multi-tensor kernel against the reference (fairseq's adam update)."""
import pytest
import torch

from support.tensors import DEVICES, randn
from fairseq_lightseq import ops
from fairseq_lightseq.ops import _backend, reference

GRAD_DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# One op call over all of these: sizes around the vector width, the CPU chunk (16384) and the
# CUDA chunk (32768), odd multi-dim shapes.
SHAPES = [(1,), (3,), (1023,), (4097,), (7, 129), (3, 5, 33), (2, 16384 + 3), (32768 * 2 + 5,)]


def _state(shapes, device, grad_dtype, seed=0):
    ps = [randn(*s, device=device, seed=seed + 4 * i) for i, s in enumerate(shapes)]
    gs = [randn(*s, dtype=grad_dtype, device=device, seed=seed + 4 * i + 1) for i, s in enumerate(shapes)]
    ms = [randn(*s, device=device, seed=seed + 4 * i + 2) * 0.1 for i, s in enumerate(shapes)]
    vs = [randn(*s, device=device, seed=seed + 4 * i + 3).abs() * 0.01 + 1e-4 for i, s in enumerate(shapes)]
    return ps, gs, ms, vs


def _clone(ts):
    return [t.clone() for t in ts]


def _assert_lists_close(actual, expected, rtol=1e-5, atol=1e-6):
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, rtol=rtol, atol=atol)


def _run_both(shapes, device, grad_dtype, steps=3, wd=0.01, grad_scale=1.0, seed=0):
    ps, gs, ms, vs = _state(shapes, device, grad_dtype, seed)
    k = (_clone(ps), _clone(ms), _clone(vs))
    r = (_clone(ps), _clone(ms), _clone(vs))
    for step in range(1, steps + 1):
        grads = [g * (step % 3 + 0.5) for g in gs]  # different grads each step, same dtype
        ops.adam_step(k[0], grads, k[1], k[2], step, 1e-3, 0.9, 0.98, 1e-8, wd, grad_scale)
        reference.adam_step(r[0], grads, r[1], r[2], step, 1e-3, 0.9, 0.98, 1e-8, wd, grad_scale)
    return k, r


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("grad_dtype", GRAD_DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
@pytest.mark.parametrize("grad_scale", [1.0, 1.0 / 1024])
def test_matches_reference(device, grad_dtype, weight_decay, grad_scale):
    k, r = _run_both(SHAPES, device, grad_dtype, wd=weight_decay, grad_scale=grad_scale)
    for a, e in zip(k, r):
        _assert_lists_close(a, e)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", [1, 3, 5, 1023, 4097, 32769])
def test_every_element_is_updated(device, n):
    """Tails: no element is left out, whatever the size (each element moves by ~lr on step 1)."""
    p = torch.zeros(n, device=device)
    g = torch.ones(n, device=device)
    m, v = torch.zeros(n, device=device), torch.zeros(n, device=device)
    ops.adam_step([p], [g], [m], [v], 1, 1e-3, 0.9, 0.999, 1e-8, 0.0)
    torch.testing.assert_close(p, torch.full_like(p, -1e-3))
    torch.testing.assert_close(m, torch.full_like(m, 0.1))


@pytest.mark.parametrize("device", DEVICES)
def test_unaligned_and_noncontiguous_inputs(device):
    """p, m, v start one element into a buffer (not 16-byte aligned: the CUDA scalar path) and the
    grad is a transposed view (copied to contiguous by the op)."""
    bufs = [randn(241 * 17 + 1, device=device, seed=s) for s in range(3)]
    bufs[1].mul_(0.1)
    bufs[2].abs_().mul_(0.01)
    p, m, v = (b[1:].view(241, 17) for b in bufs)
    g = randn(17, 241, device=device, seed=9).t()
    r = [p.clone(), m.clone(), v.clone()]
    ops.adam_step([p], [g], [m], [v], 2, 1e-3, 0.9, 0.98, 1e-8, 0.01)
    reference.adam_step([r[0]], [g], [r[1]], [r[2]], 2, 1e-3, 0.9, 0.98, 1e-8, 0.01)
    _assert_lists_close([p, m, v], r)


@pytest.mark.parametrize("device", DEVICES)
def test_mixed_grad_dtypes_in_one_call(device):
    shapes = [(5, 7), (1023,), (9,)]
    ps, _, ms, vs = _state(shapes, device, torch.float32)
    gs = [randn(*s, dtype=dt, device=device, seed=50 + i)
          for i, (s, dt) in enumerate(zip(shapes, GRAD_DTYPES))]
    k = (_clone(ps), _clone(ms), _clone(vs))
    ops.adam_step(k[0], gs, k[1], k[2], 1, 1e-3, 0.9, 0.98, 1e-8, 0.0)
    reference.adam_step(ps, gs, ms, vs, 1, 1e-3, 0.9, 0.98, 1e-8, 0.0)
    for a, e in zip(k, (ps, ms, vs)):
        _assert_lists_close(a, e)


def test_non_contiguous_state_falls_back_to_the_reference():
    p = randn(6, 5, seed=1)
    m = randn(5, 6, seed=2).t() * 0.1  # not contiguous: the kernel cannot update it in place
    v = randn(6, 5, seed=3).abs()
    g = randn(6, 5, seed=4)
    pr, mr, vr = p.clone(), m.clone(), v.clone()
    ops.adam_step([p], [g], [m], [v], 1, 1e-3, 0.9, 0.98, 1e-8, 0.0)
    reference.adam_step([pr], [g], [mr], [vr], 1, 1e-3, 0.9, 0.98, 1e-8, 0.0)
    _assert_lists_close([p, m, v], [pr, mr, vr])


def test_empty_lists_and_empty_tensors():
    ops.adam_step([], [], [], [], 1, 1e-3, 0.9, 0.98, 1e-8, 0.0)
    e = [torch.empty(0, 3) for _ in range(4)]
    p = torch.ones(3)
    ops.adam_step([e[0], p], [e[1], torch.ones(3)], [e[2], torch.zeros(3)], [e[3], torch.zeros(3)], 1, 1e-3,
                  0.9, 0.98, 1e-8, 0.0)
    assert (p < 1).all()


def test_uses_the_compiled_kernel_on_cpu():
    assert ops.has_kernel("adam_step_", "cpu")


def _op_args(n=4, **over):
    a = dict(params=[torch.zeros(n)], grads=[torch.zeros(n)], exp_avgs=[torch.zeros(n)],
             exp_avg_sqs=[torch.zeros(n)], step=1, lr=1e-3, beta1=0.9, beta2=0.98, eps=1e-8, weight_decay=0.0,
             grad_scale=1.0)
    a.update(over)
    return a


@pytest.mark.parametrize("over,match", [
    (dict(grads=[]), "grads has 0 tensors but params has 1"),
    (dict(exp_avgs=[torch.zeros(4), torch.zeros(4)]), "exp_avgs has 2 tensors"),
    (dict(params=[torch.zeros(4, dtype=torch.float16)]), r"params\[0\] must be float32"),
    (dict(exp_avg_sqs=[torch.zeros(4, dtype=torch.float64)]), r"exp_avg_sqs\[0\] must be float32"),
    (dict(grads=[torch.zeros(4, dtype=torch.float64)]), r"grads\[0\] must be float32, float16 or bfloat16"),
    (dict(grads=[torch.zeros(5)]), r"must have shape \[4\]"),
    (dict(step=0), "step must be >= 1"),
    (dict(beta1=1.0), r"beta1 must be in \[0, 1\)"),
    (dict(beta2=-0.1), r"beta2 must be in \[0, 1\)"),
    (dict(eps=-1.0), "eps must be >= 0"),
    (dict(lr=-1.0), "lr must be >= 0"),
    (dict(grad_scale=float("inf")), "grad_scale must be finite"),
    (dict(exp_avgs=[torch.zeros(8)[::2]]), "must be contiguous"),
])
def test_bad_arguments_are_named(over, match):
    a = _op_args(**over)
    with pytest.raises(RuntimeError, match=match):
        _backend.ops().adam_step_(*a.values())


def test_aliased_state_is_rejected():
    t = torch.zeros(4)
    with pytest.raises(RuntimeError, match="must be distinct tensors"):
        _backend.ops().adam_step_([t], [torch.ones(4)], [t], [torch.zeros(4)], 1, 1e-3, 0.9, 0.98, 1e-8, 0.0, 1.0)
