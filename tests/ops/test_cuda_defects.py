"""The CUDA implementations on inputs where a kernel once went wrong, run on the emulated device (marked
cuda_emulated; `make test-cuda-emulated`): each test fails on the kernel before its fix."""
import ctypes

import pytest
import torch

from support.tensors import CUDA_DTYPES, assert_close, randn
from fairseq_lightseq import ops
from fairseq_lightseq.ops import _backend, reference
from fairseq_lightseq.ops.attention import AttentionSoftmaxDropoutFunction

O = torch.ops.fairseq_lightseq
pytestmark = pytest.mark.cuda_emulated
DTYPES = [pytest.param(dt, id=str(dt)[6:]) for dt in CUDA_DTYPES]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("Tk", [37, 1030])  # the general kernel: Tk not a multiple of the vector width; Tk > 1024
def test_softmax_row_whose_first_keys_score_minus_inf(dtype, Tk):
    """A thread whose first unmasked scores are -inf (an additive -inf mask, an fp16 overflow) still sums its
    later keys: the online sum must not compute exp(-inf - -inf) = NaN."""
    s = randn(2, 2, 3, Tk, dtype=dtype, seed=1)
    s[..., : Tk // 2] = float("-inf")  # thread 0's first key is -inf, a later one is finite
    m = torch.zeros(2, Tk, dtype=torch.bool)
    y = AttentionSoftmaxDropoutFunction.apply(s, m, False, 0.5, 0.0, 1, 0)
    yr = reference.attention_softmax_dropout(s.double(), m, False, 0.5, 0.0, 1, 0)
    assert torch.isfinite(y).all()
    assert_close(y, yr.to(dtype), dtype=dtype, scale=2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_entropy_with_minus_inf_logits_first(dtype):
    """Two -inf logits reach a thread before a finite one (V > the block's threads): the log-sum-exp and the
    gradients stay finite and equal the CPU kernels'."""
    V = 1024 + 37
    z = randn(3, V, dtype=dtype, seed=2)
    z[:, :600] = float("-inf")
    target = torch.tensor([700, 1000, 1060])

    def run():
        x = z.detach().clone().requires_grad_()
        loss, nll = ops.label_smoothed_cross_entropy(x, target, 0.0, -100)
        nll.sum().backward()
        return nll.detach(), x.grad

    nll, grad = run()
    with _backend.emulated_cuda(False):
        nll_cpu, grad_cpu = run() if dtype != torch.float16 else (None, None)
    z64 = z.double().requires_grad_()
    nll_ref = torch.nn.functional.cross_entropy(z64, target, reduction="none")
    nll_ref.sum().backward()
    assert torch.isfinite(nll).all() and torch.isfinite(grad).all()
    assert_close(nll, nll_ref, dtype=dtype, scale=2)
    assert_close(grad, z64.grad, dtype=dtype, scale=2)
    if nll_cpu is not None:
        assert_close(nll, nll_cpu, dtype=dtype)


def test_layer_norm_bwd_reads_strided_mean_and_rstd():
    """mean/rstd given as strided views (every other element of a wider buffer): the op makes them contiguous
    before the kernel reads them as dense arrays."""
    x, w = randn(6, 40, seed=3), randn(40, seed=4)
    dy = randn(6, 40, seed=5)
    _, mean, rstd = O.layer_norm_fwd(x, w, torch.zeros(40), 1e-5)
    wide_mean = torch.stack([mean, torch.full_like(mean, 1e3)], 1)
    wide_rstd = torch.stack([rstd, torch.full_like(rstd, 1e3)], 1)
    dense = O.layer_norm_bwd(dy, x, w, mean, rstd)
    strided = O.layer_norm_bwd(dy, x, w, wide_mean[:, 0], wide_rstd[:, 0])
    for a, b in zip(dense, strided):
        assert torch.equal(a, b)


def test_varlen_rows_no_sentence_owns_get_zero_output_and_minus_inf_lse():
    """Offsets that leave rows to no sentence (cu[0] = 1, cu[B] < N) pass on CUDA, where the offsets' values
    are not checked on the host: those rows get the output and log-sum-exp of an empty sentence (0 and -inf),
    never uninitialised memory."""
    q = randn(6, 2, 4, seed=6)
    cu = torch.tensor([1, 3, 5], dtype=torch.int32)
    out, lse = O.varlen_attention_fwd(q, q, q, cu, cu, 2, 2, False, 0.5, 0.0, 1, 0)
    assert torch.equal(out[0], torch.zeros(2, 4)) and torch.equal(out[5], torch.zeros(2, 4))
    assert torch.equal(lse[0], torch.full((2,), float("-inf"))) and torch.equal(lse[5], lse[0])
    assert torch.isfinite(lse[1:5]).all()


def test_an_earlier_error_is_not_blamed_on_the_op():
    """An error pending from earlier work (another library's failed launch) is reported as such by the next op,
    which does not claim it; the op after that runs."""
    lib = ctypes.CDLL(_backend.EMULATION_LIBRARY)
    lib.fls_emu_set_pending_error(710)  # cudaErrorAssert
    x, w, b = randn(4, 8, seed=7), torch.ones(8), torch.zeros(8)
    with pytest.raises(RuntimeError, match=r"CUDA error from earlier work on the device, before .* \(not this op's\)"):
        O.layer_norm_fwd(x, w, b, 1e-5)
    y = O.layer_norm_fwd(x, w, b, 1e-5)[0]
    assert_close(y, reference.layer_norm(x, w, b, 1e-5))


def test_varlen_offsets_that_go_backwards_fail_a_device_assert():
    """On CUDA the offsets' values are checked in a kernel (a host check would read them back): decreasing
    offsets fail a device assert that says what is wrong, as the CPU's host check does."""
    q = randn(6, 2, 4, seed=12)
    cu = torch.tensor([0, 5, 3], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="cu_seqlens must be non-decreasing offsets within"):
        O.varlen_attention_fwd(q, q, q, cu, cu, 5, 5, False, 0.5, 0.0, 1, 0)
