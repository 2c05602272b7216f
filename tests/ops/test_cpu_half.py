"""float16 on the CPU (fairseq's --fp16 / --memory-efficient-fp16 with --cpu): the compiled CPU kernels
take fp32/fp64/bf16, so every op routes CPU fp16 tensors to its reference implementation (fp32 math,
fp16 result). Each op on fp16 inputs matches the same op on the fp32 values within fp16 tolerance,
forward and backward, and keeps the fp16 dtype."""
import pytest
import torch

from support.tensors import assert_close, randn
from fairseq_lightseq import ops

H = torch.float16


def _pair(*tensors):
    """(fp16 leaves, fp32 leaves holding the same fp16-rounded values)."""
    half = [t.to(H).detach().requires_grad_() for t in tensors]
    full = [t.detach().float().requires_grad_() for t in half]
    return half, full


def _check(fn, inputs, scale=1.0, grad_scale=4.0):
    """fn(*fp16 inputs) vs fn(*fp32 inputs) under the same torch seed (same dropout masks)."""
    half, full = _pair(*inputs)
    torch.manual_seed(11)
    outs_h = fn(*half)
    torch.manual_seed(11)
    outs_f = fn(*full)
    outs_h = outs_h if isinstance(outs_h, tuple) else (outs_h,)
    outs_f = outs_f if isinstance(outs_f, tuple) else (outs_f,)
    loss_h = loss_f = 0
    for i, (a, b) in enumerate(zip(outs_h, outs_f)):
        assert a.shape == b.shape
        assert a.dtype in (H, torch.float32), f"output {i}: dtype {a.dtype}"
        assert_close(a.float(), b, dtype=H, scale=scale, msg=f"output {i}")
        w = randn(*b.shape, seed=20 + i)
        loss_h = loss_h + (a.float() * w).sum()
        loss_f = loss_f + (b * w).sum()
    loss_h.backward()
    loss_f.backward()
    for i, (a, b) in enumerate(zip(half, full)):
        assert a.grad.dtype == H, f"grad {i}: {a.grad.dtype}"
        assert_close(a.grad.float(), b.grad, dtype=H, scale=grad_scale, msg=f"grad {i}")
    return outs_h


def test_embedding():
    tokens = torch.randint(2, 50, (3, 11))
    tokens[0, :3] = 1  # padding
    out = _check(lambda w, pw: ops.embedding(tokens, w, pw, 1, scale=4.0, p=0.2),
                 [randn(50, 16, seed=1), randn(64, 16, seed=2)])
    assert out[0].dtype == H


def test_layer_norm():
    out = _check(lambda x, w, b: ops.layer_norm(x, w, b), [randn(5, 7, 24, seed=1) * 3 + 1, randn(24, seed=2),
                                                           randn(24, seed=3)])
    assert out[0].dtype == H


@pytest.mark.parametrize("act", ["relu", "gelu", "gelu_tanh"])
def test_bias_act_dropout(act):
    out = _check(lambda x, b: ops.bias_act_dropout(x, b, 0.25, act), [randn(6, 5, 40, seed=1), randn(40, seed=2)])
    assert out[0].dtype == H


def test_bias_dropout_residual():
    out = _check(lambda x, b, r: ops.bias_dropout_residual(x, b, r, 0.3),
                 [randn(6, 5, 40, seed=1), randn(40, seed=2), randn(6, 5, 40, seed=3)])
    assert out[0].dtype == H


@pytest.mark.parametrize("causal", [False, True])
def test_attention_softmax_dropout(causal):
    mask = torch.zeros(2, 9, dtype=torch.bool)
    mask[1, 6:] = True
    out = _check(lambda s: ops.attention_softmax_dropout(s, mask, causal, 0.5, 0.2), [randn(2, 3, 9, 9, seed=1) * 4])
    assert out[0].dtype == H


def test_qkv_bias_split_and_merge_heads():
    def fn(qkv, bias):
        q, k, v = ops.qkv_bias_split(qkv, bias, 4)
        return ops.merge_heads(q * 2 + k - v, 4)
    out = _check(fn, [randn(7, 3, 96, seed=1), randn(96, seed=2)])
    assert out[0].dtype == H


def test_label_smoothed_cross_entropy():
    target = torch.randint(0, 30, (40,))
    target[::7] = 1  # ignored
    loss, nll = _check(lambda z: ops.label_smoothed_cross_entropy(z, target, 0.1, ignore_index=1),
                       [randn(40, 30, seed=1) * 3])
    assert loss.dtype == torch.float32 and nll.dtype == torch.float32  # fp32 losses whatever the logits


@pytest.mark.parametrize("reduction", ["none", "sum"])
def test_linear_label_smoothed_cross_entropy(reduction):
    target = torch.randint(0, 30, (40,))

    def fn(h, w):  # the sums as [1]: _check weights each output by a random tensor of its shape
        loss, nll = ops.linear_label_smoothed_cross_entropy(h, w, target, 0.1, ignore_index=1, chunk_size=16,
                                                            reduction=reduction)
        return loss.reshape(-1), nll.reshape(-1)

    _check(fn, [randn(40, 16, seed=1), randn(30, 16, seed=2)], grad_scale=8.0)


def test_bf16_and_fp32_still_use_the_kernels():
    from fairseq_lightseq.ops import _backend
    assert _backend.use_kernel("layer_norm_fwd", "cpu", torch.float32)
    assert _backend.use_kernel("layer_norm_fwd", "cpu", torch.bfloat16)
    assert not _backend.use_kernel("layer_norm_fwd", "cpu", torch.float16)
