"""Philox4x32-10 and the dropout keep mask: known-answer vectors, the compiled generator against the
pure-PyTorch reference bit for bit, statistics, seeding and the no-RNG cases."""
import math
import os
import subprocess
import sys

import pytest
import torch

from support.tensors import CUDA_DEVICES, cpu_kernels
from fairseq_lightseq import ops
from fairseq_lightseq.ops.reference import philox

# Random123's known-answer vectors for philox4x32_10: (counter, key) -> output.
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize("ctr,key,expected", KAT)
def test_reference_known_answers(ctr, key, expected):
    c = [torch.tensor([v], dtype=torch.int64) for v in ctr]
    out = philox.philox4x32_10(*c, *key)
    assert tuple(int(o) for o in out) == expected


def _compiled_top24(group, seed):
    """Top 24 bits of the compiled generator's 4 outputs for (group, seed), recovered from the keep
    mask alone by bisection on the threshold: keep(u) iff u >> 8 >= floor(p * 2^24)."""
    lo = torch.zeros(4, dtype=torch.int64)
    hi = torch.full((4,), 1 << 24, dtype=torch.int64)  # u >> 8 in [lo, hi)
    for _ in range(24):
        mid = (lo + hi) // 2
        keep = torch.stack([ops.dropout_mask(1, int(m) / 2**24, seed, 4 * group + k)[0] for k, m in enumerate(mid)])
        lo = torch.where(keep, mid, lo)
        hi = torch.where(keep, hi, mid)
    return [int(v) for v in lo]


def test_compiled_generator_known_answer_zero_counter_zero_key():
    # The compiled generator's counter is (lo32(group), hi32(group), 0, 0): the zero vector applies.
    assert _compiled_top24(0, 0) == [v >> 8 for v in KAT[0][2]]


@pytest.mark.parametrize("seed", [0, 1, 12345, -7, 2**63 - 1, -(2**63)])
@pytest.mark.parametrize("offset", [0, 1, 2, 3, 5, 4096 + 3, (1 << 34) + 2])
@pytest.mark.parametrize("numel", [1, 3, 4, 7, 4097])
def test_cpu_mask_equals_reference(seed, offset, numel):
    p = 0.37
    got = ops.dropout_mask(numel, p, seed, offset, "cpu")
    assert got.dtype == torch.bool and got.shape == (numel,)
    assert torch.equal(got, philox.keep_mask(numel, p, seed, offset))


@pytest.mark.parametrize("p", [0.0, 1e-9, 0.1, 0.5, 0.9, 1.0])
def test_cpu_mask_equals_reference_over_p(p):
    assert torch.equal(ops.dropout_mask(10001, p, 99, 13, "cpu"), philox.keep_mask(10001, p, 99, 13))


# Draws whose counter's low word wraps around inside one Philox batch (group 2^32 - 3 onwards).
WRAP_OFFSET = 4 * ((1 << 32) - 3) + 1

_VERSION_CHILD = """
import torch
from fairseq_lightseq import ops
from fairseq_lightseq.ops.reference import philox
for numel in (1, 3, 31, 32, 33, 63, 64, 65, 4097):
    for offset in (0, 1, 2, 7, {wrap}):
        for seed in (0, -7, 12345):
            got = ops.dropout_mask(numel, 0.37, seed, offset, "cpu")
            assert torch.equal(got, philox.keep_mask(numel, 0.37, seed, offset)), (numel, offset, seed)
print("OK")
"""


@pytest.mark.parametrize("version", ["portable", "avx2", "widest"])
def test_every_cpu_philox_version_equals_reference(version):
    """philox_batch.cpp has AVX-512, AVX2 and portable versions and runs the widest the CPU has;
    FLS_CPU_PHILOX picks a narrower one (read once per process, hence a child process), so each
    is checked here against the reference, including a counter whose low word wraps inside a batch.
    A version the CPU lacks falls back to a narrower one, which is then what gets checked."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    env.pop("FLS_CPU_PHILOX", None)
    if version != "widest":
        env["FLS_CPU_PHILOX"] = version
    code = _VERSION_CHILD.format(wrap=WRAP_OFFSET)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0 and "OK" in r.stdout, (r.stdout + r.stderr)[-3000:]


def test_mask_of_a_shifted_window_is_a_slice():
    full = ops.dropout_mask(1000, 0.3, 5, 0)
    assert torch.equal(ops.dropout_mask(500, 0.3, 5, 217), full[217:717])


@pytest.mark.parametrize("device", CUDA_DEVICES)
@pytest.mark.parametrize("offset", [0, 3, (1 << 34) + 1])
def test_cuda_mask_equals_cpu_mask(device, offset):
    for numel in [1, 5, 4097, 1 << 16]:
        with cpu_kernels():
            cpu = ops.dropout_mask(numel, 0.25, -31, offset, "cpu")
        gpu = ops.dropout_mask(numel, 0.25, -31, offset, device)
        assert torch.equal(gpu.cpu(), cpu)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_kept_fraction_within_binomial_bounds(p):
    n = 1 << 20
    kept = int(ops.dropout_mask(n, p, 2024, 0).sum())
    sd = math.sqrt(n * p * (1 - p))
    assert abs(kept - n * (1 - p)) < 6 * sd


def test_masks_of_different_seeds_are_uncorrelated():
    a = ops.dropout_mask(1 << 16, 0.5, 1, 0).float()
    b = ops.dropout_mask(1 << 16, 0.5, 2, 0).float()
    assert abs(float(((a - 0.5) * (b - 0.5)).mean()) * 4) < 6 / math.sqrt(1 << 16)


def _both_ops(x, b, r):
    return ops.bias_dropout_residual(x, b, r, 0.3), ops.bias_act_dropout(x, b, 0.3, "gelu")


def test_manual_seed_reproduces_and_consecutive_calls_differ():
    x, b, r = torch.randn(8, 33), torch.randn(33), torch.randn(8, 33)
    torch.manual_seed(123)
    first = _both_ops(x, b, r)
    again = _both_ops(x, b, r)
    torch.manual_seed(123)
    second = _both_ops(x, b, r)
    for u, v in zip(first, second):
        assert torch.equal(u, v)
    assert not torch.equal(first[0], again[0])


@pytest.mark.parametrize("p,training", [(0.0, True), (0.3, False), (0.0, False)])
def test_no_dropout_draws_no_seed_and_changes_nothing(p, training):
    x, b, r = torch.randn(5, 17), torch.randn(17), torch.randn(5, 17)
    state = torch.random.get_rng_state()
    y = ops.bias_dropout_residual(x, b, r, p, training=training)
    z = ops.bias_act_dropout(x, b, p, "relu", training=training)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert torch.equal(y, r + (x + b))
    assert torch.equal(z, torch.relu(x + b))


def test_p_one_gives_zeros():
    x, b, r = torch.randn(5, 17), torch.randn(17), torch.randn(5, 17)
    assert torch.equal(ops.bias_dropout_residual(x, b, r, 1.0), r)
    for act in ("relu", "gelu", "gelu_tanh"):
        assert torch.equal(ops.bias_act_dropout(x, b, 1.0, act), torch.zeros_like(x))
