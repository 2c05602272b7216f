"""`--criterion ls_label_smoothed_cross_entropy`: fairseq's label_smoothed_cross_entropy computed by the
fused projection + loss (criterions/fused_loss.py), so that neither a [B*T, V] fp32 log-prob tensor nor
(in training) the [B*T, V] logits are kept for backward. Same options, logging and metrics as fairseq's
criterion (it subclasses it).
"""
from dataclasses import dataclass

from fairseq.criterions import register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterion,
    LabelSmoothedCrossEntropyCriterionConfig,
)

from ..errors import ConfigurationError
from .fused_loss import FusedLossMixin


@dataclass
class LsLabelSmoothedCrossEntropyCriterionConfig(LabelSmoothedCrossEntropyCriterionConfig):
    """Same fields as fairseq's: label_smoothing, report_accuracy, ignore_prefix_size, sentence_avg."""


@register_criterion("ls_label_smoothed_cross_entropy", dataclass=LsLabelSmoothedCrossEntropyCriterionConfig)
class LsLabelSmoothedCrossEntropyCriterion(FusedLossMixin, LabelSmoothedCrossEntropyCriterion):
    def __init__(self, task, sentence_avg, label_smoothing, ignore_prefix_size=0, report_accuracy=False):
        # Checked here, at build, rather than by the op at the first forward. 1 is excluded: the target
        # would get weight 1 - eps - eps/(V-1) < 0.
        if not 0.0 <= float(label_smoothing) < 1.0:
            raise ConfigurationError(f"ls_label_smoothed_cross_entropy: --label-smoothing must be in [0, 1), "
                                     f"got {label_smoothing}")
        super().__init__(task, sentence_avg, label_smoothing, ignore_prefix_size=ignore_prefix_size,
                         report_accuracy=report_accuracy)

    def compute_loss(self, model, net_output, sample, reduce=True):
        if not self._uses_loss_op(model):
            return super().compute_loss(model, net_output, sample, reduce=reduce)
        loss, nll_loss = self._logits_loss(model, net_output, sample)
        if reduce:
            return loss.sum(), nll_loss.sum()
        # fairseq's unreduced shape with an ignore_index: [N, 1]
        return loss.unsqueeze(-1), nll_loss.unsqueeze(-1)
