"""layer_norm: the fused kernels against the reference, forward and backward."""
import pytest
import torch

from support.tensors import DEVICE_DTYPES, assert_close, randn
from fairseq_lightseq import ops
from fairseq_lightseq.ops import reference

SHAPES = [(1, 1, 8), (3, 5, 512), (7, 1, 1024), (2, 13, 129), (1, 4097), (33, 2, 7),
          (4100, 256), (9, 40)]  # many row chunks in the column sums; a short row of 16-byte vectors


def _inputs(shape, device, dtype, seed=0):
    c = shape[-1]
    x = randn(*shape, dtype=dtype, device=device, seed=seed) * 3 + 1
    w = randn(c, dtype=dtype, device=device, seed=seed + 1)
    b = randn(c, dtype=dtype, device=device, seed=seed + 2)
    return [t.detach().requires_grad_() for t in (x, w, b)]


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_forward_backward_match_reference(device, dtype, shape):
    x, w, b = _inputs(shape, device, dtype)
    xr, wr, br = [t.detach().clone().requires_grad_() for t in (x, w, b)]
    y = ops.layer_norm(x, w, b, 1e-5)
    yr = reference.layer_norm(xr, wr, br, 1e-5)
    assert y.dtype == dtype and y.shape == x.shape
    assert_close(y, yr)
    dy = randn(*shape, dtype=dtype, device=device, seed=7)
    y.backward(dy)
    yr.backward(dy)
    # Column sums over many rows accumulate more rounding in low precision.
    assert_close(x.grad, xr.grad, scale=4)
    assert_close(w.grad, wr.grad, scale=4 * max(1, x.numel() // shape[-1]) ** 0.5)
    assert_close(b.grad, br.grad, scale=4 * max(1, x.numel() // shape[-1]) ** 0.5)


@pytest.mark.parametrize("shape", [(2, 3, 17), (1, 1, 5), (4, 33)])
def test_gradcheck_float64(shape):
    x, w, b = _inputs(shape, "cpu", torch.float64)
    assert torch.autograd.gradcheck(lambda x, w, b: ops.layer_norm(x, w, b, 1e-5), (x, w, b))


def test_uses_the_compiled_kernel_on_cpu():
    assert ops.has_kernel("layer_norm_fwd", "cpu")


def test_large_mean_is_stable():
    x = randn(4, 256, seed=3) + 1e4
    w, b = torch.ones(256), torch.zeros(256)
    assert_close(ops.layer_norm(x, w, b), reference.layer_norm(x.double(), w.double(), b.double()).float(),
                 scale=1000)  # naive E[x^2]-E[x]^2 in fp32 is off by O(1) here


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_large_mean_in_low_precision_matches_reference(device, dtype):
    """Rows whose mean dwarfs their spread (64 + N(0, 1)), long enough for the general kernels (4097 columns):
    the sums must accumulate in fp32 whatever the storage dtype; sums kept in fp16/bf16 lose the spread."""
    x = (randn(3, 4097, seed=5) + 64).to(dtype).to(device)
    w, b = randn(4097, dtype=dtype, device=device, seed=6), randn(4097, dtype=dtype, device=device, seed=7)
    assert_close(ops.layer_norm(x, w, b, 1e-5), reference.layer_norm(x.double(), w.double(), b.double()).to(dtype),
                 dtype=dtype, scale=2)


@pytest.mark.cuda(why="4.2M rows of the general kernels are 1.1e9 CUDA threads, hours on the emulated device")
def test_backward_over_64_x_65535_rows_on_a_gpu():
    """The general backward's partial sums loop over their row chunks past grid.y's 65535 (64 rows a chunk)."""
    rows = 64 * 65535 + 7
    x = randn(rows, 3, device="cuda", seed=8)  # 3 columns: the general (not vector) kernels
    w, b = randn(3, device="cuda", seed=9), randn(3, device="cuda", seed=10)
    xr, wr, br = (t.double().requires_grad_() for t in (x, w, b))
    x, w, b = (t.requires_grad_() for t in (x, w, b))
    dy = randn(rows, 3, device="cuda", seed=11)
    ops.layer_norm(x, w, b, 1e-5).backward(dy)
    reference.layer_norm(xr, wr, br, 1e-5).backward(dy.double())
    assert_close(w.grad, wr.grad, dtype=torch.float32, scale=4 * rows ** 0.5)
    assert_close(b.grad, br.grad, dtype=torch.float32, scale=4 * rows ** 0.5)


def test_zero_rows():
    x = torch.empty(0, 16, requires_grad=True)
    w = torch.ones(16, requires_grad=True)
    b = torch.zeros(16, requires_grad=True)
    y = ops.layer_norm(x, w, b)
    y.sum().backward()
    assert y.shape == (0, 16) and torch.equal(w.grad, torch.zeros(16))


@pytest.mark.parametrize(
    "args,match",
    [
        (lambda: (torch.randn(4, 8), torch.randn(7), torch.randn(8)), "weight must have shape"),
        (lambda: (torch.randn(4, 8), torch.randn(8, dtype=torch.float64), torch.randn(8)), "weight has dtype"),
        (lambda: (torch.randn(4, 8).int(), torch.randn(8).int(), torch.randn(8).int()), "x must be float32"),
        (lambda: (torch.randn(4, 0), torch.randn(0), torch.randn(0)), "non-empty last dimension"),
    ],
)
def test_bad_input_names_the_argument(args, match):
    with pytest.raises(RuntimeError, match=match):
        ops.layer_norm(*args())


def test_bad_eps():
    with pytest.raises(RuntimeError, match="eps must be > 0"):
        ops.layer_norm(torch.randn(2, 4), torch.ones(4), torch.zeros(4), 0.0)


def test_traces_under_torch_compile_fake_tensors():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(3, 5, 64)
        y, mean, rstd = torch.ops.fairseq_lightseq.layer_norm_fwd(x, torch.empty(64), torch.empty(64), 1e-5)
    assert y.shape == (3, 5, 64) and mean.shape == (15,) and rstd.dtype == torch.float32


def test_gradients_do_not_depend_on_thread_count():
    # dweight/dbias are sums over rows in fixed chunks; the chunk partial sums must not depend on how
    # chunks are spread over threads. 1000 rows: not a multiple of the chunk.
    x, w, b = (t.detach() for t in _inputs((1000, 129), "cpu", torch.float32))
    dy = randn(1000, 129, seed=7)
    f = torch.ops.fairseq_lightseq
    n = torch.get_num_threads()
    try:
        outs = []
        for t in (1, max(2, n)):
            torch.set_num_threads(t)
            _, mean, rstd = f.layer_norm_fwd(x, w, b, 1e-5)
            outs.append(f.layer_norm_bwd(dy, x, w, mean, rstd))
    finally:
        torch.set_num_threads(n)
    assert all(torch.equal(a, c) for a, c in zip(*outs))
