"""Label-smoothed cross entropy with fairseq's formula, and its fusion with the output projection."""
__all__ = ["label_smoothed_cross_entropy", "linear_label_smoothed_cross_entropy"]

from typing import Optional

import torch


def label_smoothed_cross_entropy(logits: torch.Tensor, target: torch.Tensor, epsilon: float,
                                 ignore_index: int = -100):
    """Per-token (loss, nll), float32 [N] (float64 for float64 logits); zero where target == ignore_index.

    logits: [N, V]; target: [N] int64. fairseq's label_smoothed_nll_loss: eps_i = epsilon / (V - 1),
    loss = (1 - epsilon - eps_i) * nll + eps_i * sum_v(-log p_v). Math in fp32 (fp64).
    """
    acc = torch.float64 if logits.dtype == torch.float64 else torch.float32
    lprobs = torch.log_softmax(logits.to(acc), dim=-1)
    pad = target.eq(ignore_index)
    safe = target.masked_fill(pad, 0)
    nll = -lprobs.gather(-1, safe.unsqueeze(-1)).squeeze(-1)
    smooth = -lprobs.sum(-1)
    V = logits.shape[-1]
    eps_i = epsilon / (V - 1) if V > 1 else 0.0
    loss = (1.0 - epsilon - eps_i) * nll + eps_i * smooth
    return loss.masked_fill(pad, 0.0), nll.masked_fill(pad, 0.0)


def linear_label_smoothed_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                                        epsilon: float, ignore_index: int = -100, reduction: str = "none",
                                        return_argmax: bool = False, bias: Optional[torch.Tensor] = None):
    """label_smoothed_cross_entropy(hidden @ weight.T + bias, ...). hidden: [N, d]; weight: [V, d];
    bias: None or [V].

    reduction="none": (loss, nll) [N]; "sum": (loss.sum(), nll.sum()) 0-dim, the nll sum without a
    gradient. return_argmax adds the logits' argmax over V per row, [N] int64."""
    logits = hidden @ weight.t() if bias is None else hidden @ weight.t() + bias
    loss, nll = label_smoothed_cross_entropy(logits, target, epsilon, ignore_index)
    out = (loss.sum(), nll.sum().detach()) if reduction == "sum" else (loss, nll)
    return out + (logits.argmax(-1),) if return_argmax else out
