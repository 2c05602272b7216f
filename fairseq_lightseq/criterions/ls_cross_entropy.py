"""`--criterion ls_cross_entropy`: fairseq's cross_entropy (the language model's loss: no smoothing,
--sentence-avg) computed by the fused projection + loss (criterions/fused_loss.py) with eps = 0, so
training keeps no [tokens, V] logits. Same option, logging output (loss, ntokens, nsentences,
sample_size) and metrics (loss, nll_loss under --sentence-avg, ppl) as fairseq's criterion: it
subclasses it and keeps its reduce_metrics.
"""
from dataclasses import dataclass

from fairseq.criterions import register_criterion
from fairseq.criterions.cross_entropy import CrossEntropyCriterion, CrossEntropyCriterionConfig

from .fused_loss import FusedLossMixin


@dataclass
class LsCrossEntropyCriterionConfig(CrossEntropyCriterionConfig):
    """Same field as fairseq's: sentence_avg."""


@register_criterion("ls_cross_entropy", dataclass=LsCrossEntropyCriterionConfig)
class LsCrossEntropyCriterion(FusedLossMixin, CrossEntropyCriterion):
    LOGS_NLL = False  # fairseq's cross_entropy logs "loss" only (nll_loss is derived in reduce_metrics)
    eps = 0.0
    ignore_prefix_size = 0
    report_accuracy = False

    def compute_loss(self, model, net_output, sample, reduce=True):
        """fairseq's (loss, loss): summed, or per target token [N] with reduce=False."""
        if not self._uses_loss_op(model):
            return super().compute_loss(model, net_output, sample, reduce=reduce)
        loss, _ = self._logits_loss(model, net_output, sample)
        if reduce:
            loss = loss.sum()
        return loss, loss
