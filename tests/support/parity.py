"""Comparisons shared by the model-parity tests (ours against fairseq's on the same weights)."""
import torch


def rel_err(a, b, floor: float = 1e-30) -> float:
    """max |a - b| / max(max |b|, floor): the error relative to the tensor's scale."""
    a, b = torch.as_tensor(a).double(), torch.as_tensor(b).double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(floor))


def assert_grads_match(g: dict, g_ref: dict, tol: float) -> None:
    """Same parameter names with gradients, each within tol relative; the attention's key biases (zero
    gradient in exact arithmetic, rounding noise on both sides) within tol of the largest gradient."""
    assert g.keys() == g_ref.keys()
    top = max(float(v.abs().max()) for v in g_ref.values())
    for n in g_ref:
        if n.endswith("k_proj.bias"):
            assert float(g[n].abs().max()) < tol * top, n
        else:
            assert rel_err(g[n], g_ref[n]) < tol, n
