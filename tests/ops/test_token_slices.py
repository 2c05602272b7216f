"""Token-wise ops on time-major row slices, as sequence parallelism calls them: rows [t0, t1) of a
[T, B, C] stream are the flat range from t0*B*C, so a call on those rows with the dropout offset moved by
t0*B*C equals rows [t0, t1) of the full call, forward and backward (parameter gradients: the slices'
sum is the full call's)."""
import pytest
import torch

from support.tensors import DEVICE_DTYPES, assert_close, assert_same_or_close, randn
from fairseq_lightseq import ops
from fairseq_lightseq.ops import reference

T, B, C = 7, 3, 13
SEED = 9176523001234567
PAD = 1
# a partition of the T rows (the P ranks' segments), then single rows anywhere
PARTITION = [(0, 4), (4, 7)]
ROWS = [(0, 1), (3, 4), (6, 7), (2, 6)]


def _tokens():
    """[T, B] int64 as the model passes them (fairseq's [B, T] transposed): left padding, one short row."""
    tok = torch.randint(PAD + 1, 20, (B, T), generator=torch.Generator().manual_seed(4))
    tok[1, :2] = PAD
    tok[2, :5] = PAD
    return tok.t().contiguous()


def _cases():
    """name -> (make_inputs(device, dtype), call(inputs, rows, draw) -> output rows, differentiable inputs:
    index of the row-sliced input or None, parameter indices)."""
    def dense(device, dtype):
        return [randn(T, B, C, dtype=dtype, device=device, seed=1), randn(C, dtype=dtype, device=device, seed=2),
                randn(T, B, C, dtype=dtype, device=device, seed=3)]

    def embed(device, dtype):
        tok = _tokens().to(device)
        positions = reference.make_positions(tok.t(), PAD).t().contiguous()  # from the full tokens
        return [randn(20, C, dtype=dtype, device=device, seed=5), randn(T + PAD + 1, C, dtype=dtype, device=device,
                                                                        seed=6), tok, positions]

    def rows(t, r):
        return t[r[0]:r[1]]

    return {
        "bias_dropout_residual": (dense, lambda x, r, d: ops.bias_dropout_residual(rows(x[0], r), x[1],
                                                                                   rows(x[2], r), d), (0, 2), (1,)),
        "bias_act_dropout": (dense, lambda x, r, d: ops.bias_act_dropout(rows(x[0], r), x[1], d, "gelu"), (0,), (1,)),
        "layer_norm": (dense, lambda x, r, d: ops.layer_norm(rows(x[0], r), x[1], x[2][0, 0]), (0,), (1, 2)),
        "dropout": (dense, lambda x, r, d: ops.dropout(rows(x[0], r), d), (0,), ()),
        "embedding": (embed, lambda x, r, d: ops.embedding(rows(x[2], r), x[0], x[1], PAD, C**0.5, d,
                                                           positions=rows(x[3], r)), (), (0, 1)),
    }


CASES = _cases()


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("p", [0.1, 0.5])
def test_row_slice_with_offset_equals_rows_of_full_call(device, dtype, name, p):
    make, call, sliced, params = CASES[name]
    offset = 3 << 40
    inputs = make(device, dtype)
    for i in sliced + params:
        inputs[i].requires_grad_()
    full = call(inputs, (0, T), ops.Dropout(p, SEED, offset))
    g = randn(*full.shape, dtype=dtype, device=device, seed=8)
    grads = torch.autograd.grad(full, [inputs[i] for i in sliced + params], g)
    full_param_grads = grads[len(sliced):]
    partition_sum = [torch.zeros_like(w) for w in full_param_grads]
    for r in PARTITION + ROWS:
        draw = ops.Dropout(p, SEED, offset + r[0] * B * C)
        y = call(inputs, r, draw)
        assert_same_or_close(y, full[r[0]:r[1]])
        got = torch.autograd.grad(y, [inputs[i] for i in sliced + params], g[r[0]:r[1]])
        for k, i in enumerate(sliced):
            assert_same_or_close(got[k][r[0]:r[1]], grads[k][r[0]:r[1]])
            assert not got[k][:r[0]].any() and not got[k][r[1]:].any()
        if r in PARTITION:
            partition_sum = [s + w for s, w in zip(partition_sum, got[len(sliced):])]
    for s, w in zip(partition_sum, full_param_grads):
        assert_close(s, w, scale=4)
