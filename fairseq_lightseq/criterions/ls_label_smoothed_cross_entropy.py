"""`--criterion ls_label_smoothed_cross_entropy`: fairseq's label_smoothed_cross_entropy computed by
the fused op on the decoder's logits, so no [B*T, V] fp32 log-prob tensor is built.

Same options, logging and metrics as fairseq's criterion (it subclasses it); only the loss and the
accuracy computation change. Models with an adaptive softmax fall back to fairseq's computation.
Under sequence parallelism it is the criterion that takes a rank's target columns and counts its share.
"""
from dataclasses import dataclass

import torch
from fairseq import utils
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

    def forward(self, model, sample, reduce=True):
        """fairseq's forward; under sequence parallelism (the decoder returned this rank's rows) the
        counts are this rank's share, so that fairseq's sums over all ranks count everything once:
        ntokens and sample_size are the local target tokens, nsentences (and sample_size under
        --sentence-avg) come from SP rank 0 only."""
        net_output = model(**sample["net_input"])
        shard = net_output[1].get("sequence_parallel") if isinstance(net_output[1], dict) else None
        if shard is None:
            return self._outputs(model, net_output, sample, reduce)
        ntokens = int(self._target(model, net_output, sample).ne(self.padding_idx).sum())
        nsentences = sample["target"].size(0) if shard.rank == 0 else 0
        counts = {"ntokens": ntokens, "nsentences": nsentences}
        return self._outputs(model, net_output, sample, reduce, counts, nsentences if self.sentence_avg else ntokens)

    def _outputs(self, model, net_output, sample, reduce, counts=None, sample_size=None):
        """(loss, sample_size, logging_output) as fairseq's forward computes them, with the counts given."""
        loss, nll_loss = self.compute_loss(model, net_output, sample, reduce=reduce)
        if counts is None:
            counts = {"ntokens": sample["ntokens"], "nsentences": sample["target"].size(0)}
            sample_size = counts["nsentences"] if self.sentence_avg else counts["ntokens"]
        logging_output = {"loss": loss.data, "nll_loss": nll_loss.data, **counts, "sample_size": sample_size}
        if self.report_accuracy:
            n_correct, total = self.compute_accuracy(model, net_output, sample)
            logging_output["n_correct"] = utils.item(n_correct.data)
            logging_output["total"] = utils.item(total.data)
        return loss, sample_size, logging_output

    def _target(self, model, net_output, sample):
        """The target [B, T] int64, or under sequence parallelism this rank's columns of it (padded with
        pad tokens like the decoder's input, so the padding adds nothing to the loss)."""
        target = model.get_targets(sample, net_output)
        shard = net_output[1].get("sequence_parallel") if isinstance(net_output[1], dict) else None
        if shard is not None:
            target = shard.local(shard.pad(target, self.padding_idx))
        return target

    def get_logits_and_target(self, model, net_output, sample):
        """Logits [N, V] (the model's dtype) and target [N] int64, with the ignored prefix cut off."""
        logits = net_output[0]
        target = self._target(model, net_output, sample)
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
