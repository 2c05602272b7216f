"""The layer norm and residual ends of a one-node sublayer (ops/blocks/attention.py,
ops/blocks/feed_forward.py), pre-LN or post-LN, in backward.

pre-LN:  h = LN(x),  y = x + f(h)       post-LN:  h = x,  s = x + f(h),  y = LN(s)
"""
import torch


def forward_start(ops, x: torch.Tensor, ln_weight, ln_bias, normalize_before: bool, eps: float):
    """-> (h, mean, rstd): the sublayer's input h = LN(x) for pre-LN (with its statistics), else x."""
    if normalize_before:
        return ops.layer_norm_fwd(x, ln_weight, ln_bias, eps)
    return x, None, None


def forward_end(ops, out: torch.Tensor, bias, x: torch.Tensor, dropout, ln_weight, ln_bias, mean, rstd,
                normalize_before: bool, eps: float):
    """-> (y, s, mean, rstd): the residual sum s = x + dropout(out + bias) and the block output y
    (s for pre-LN, LN(s) for post-LN, whose statistics replace the given ones). s is returned for
    saving only where backward needs it (post-LN), else None."""
    s = ops.bias_dropout_residual_fwd(out, bias, x, *dropout)
    if normalize_before:
        return s, None, mean, rstd
    y, mean, rstd = ops.layer_norm_fwd(s, ln_weight, ln_bias, eps)
    return y, s, mean, rstd


def backward_start(ops, dy: torch.Tensor, x: torch.Tensor, s, ln_weight, ln_bias, mean, rstd, normalize_before: bool,
                   eps: float):
    """-> (ds, h, dln_weight, dln_bias): ds = dL/ds of the residual sum s, h = the sublayer's input
    (recomputed for pre-LN rather than saved), the norm's parameter grads (post-LN; pre-LN's come
    from backward_end). x, s: [T, B, E]; mean, rstd: the saved statistics."""
    if normalize_before:
        return dy, ops.layer_norm_fwd(x, ln_weight, ln_bias, eps)[0], None, None
    ds, dln_w, dln_b = ops.layer_norm_bwd(dy, s, ln_weight, mean, rstd)
    return ds, x, dln_w, dln_b


def backward_end(ops, ds, dh, x, ln_weight, mean, rstd, normalize_before: bool, dln_w, dln_b):
    """-> (dx, dln_weight, dln_bias): the residual path's gradient ds plus h's gradient dh taken
    back through the pre-LN norm."""
    if normalize_before:
        dhx, dln_w, dln_b = ops.layer_norm_bwd(dh, x, ln_weight, mean, rstd)
        return ds + dhx, dln_w, dln_b
    return ds + dh, dln_w, dln_b
