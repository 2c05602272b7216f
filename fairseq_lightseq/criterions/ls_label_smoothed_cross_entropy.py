"""`--criterion ls_label_smoothed_cross_entropy`: fairseq's label_smoothed_cross_entropy computed by
the fused op on the decoder's logits, so no [B*T, V] fp32 log-prob tensor is built.

Same options, logging and metrics as fairseq's criterion (it subclasses it); only the loss and the
accuracy computation change. Models with an adaptive softmax fall back to fairseq's computation.
"""
from dataclasses import dataclass

import torch
from fairseq.criterions import register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterion,
    LabelSmoothedCrossEntropyCriterionConfig,
)

from ..ops import label_smoothed_cross_entropy


@dataclass
class LsLabelSmoothedCrossEntropyCriterionConfig(LabelSmoothedCrossEntropyCriterionConfig):
    """Same fields as fairseq's: label_smoothing, report_accuracy, ignore_prefix_size, sentence_avg."""


@register_criterion("ls_label_smoothed_cross_entropy", dataclass=LsLabelSmoothedCrossEntropyCriterionConfig)
class LsLabelSmoothedCrossEntropyCriterion(LabelSmoothedCrossEntropyCriterion):
    def __init__(self, task, sentence_avg, label_smoothing, ignore_prefix_size=0, report_accuracy=False):
        # Checked here, at build, rather than by the op at the first forward. 1 is excluded: the target
        # would get weight 1 - eps - eps/(V-1) < 0.
        if not 0.0 <= float(label_smoothing) < 1.0:
            raise ValueError(f"ls_label_smoothed_cross_entropy: --label-smoothing must be in [0, 1), "
                             f"got {label_smoothing}")
        super().__init__(task, sentence_avg, label_smoothing, ignore_prefix_size=ignore_prefix_size,
                         report_accuracy=report_accuracy)

    def _uses_fused_path(self, model):
        decoder = getattr(model, "decoder", None)
        return getattr(decoder, "adaptive_softmax", None) is None

    def get_logits_and_target(self, model, net_output, sample):
        """Logits [N, V] (the model's dtype) and target [N] int64, with the ignored prefix cut off."""
        logits = net_output[0]
        target = model.get_targets(sample, net_output)
        if self.ignore_prefix_size > 0:
            logits = logits[:, self.ignore_prefix_size:, :]
            target = target[:, self.ignore_prefix_size:]
        return logits.reshape(-1, logits.size(-1)), target.reshape(-1)

    def compute_loss(self, model, net_output, sample, reduce=True):
        if not self._uses_fused_path(model):
            return super().compute_loss(model, net_output, sample, reduce=reduce)
        logits, target = self.get_logits_and_target(model, net_output, sample)
        loss, nll_loss = label_smoothed_cross_entropy(logits, target, self.eps, ignore_index=self.padding_idx)
        if reduce:
            return loss.sum(), nll_loss.sum()
        # fairseq's unreduced shape with an ignore_index: [N, 1]
        return loss.unsqueeze(-1), nll_loss.unsqueeze(-1)

    def compute_accuracy(self, model, net_output, sample):
        if not self._uses_fused_path(model):
            return super().compute_accuracy(model, net_output, sample)
        # argmax of the logits is the argmax of the log-probs: no log_softmax needed.
        logits, target = self.get_logits_and_target(model, net_output, sample)
        mask = target.ne(self.padding_idx)
        n_correct = torch.sum(logits.argmax(1).masked_select(mask).eq(target.masked_select(mask)))
        total = torch.sum(mask)
        return n_correct, total
