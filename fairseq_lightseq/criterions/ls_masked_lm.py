"""`--criterion ls_masked_lm`: fairseq's masked_lm (the loss over the masked positions only, summed;
sample_size = their count) with the LM head's projection and the loss fused, so training keeps no
[masked tokens, V] logits.

    features = model(src_tokens, features_only=True)         # [B, T, E]
    hidden = lm_head.transform(features[masked])             # [M, E]: dense, activation, layer norm
    loss = linear_label_smoothed_cross_entropy(hidden, lm_head.weight, target[masked], 0,
                                               bias=lm_head.bias, reduction="sum")

One device sync, the masked rows' indices, shared by the features and the targets (fairseq's has two
boolean selections, of the features and of the targets, and on the CPU an `.any()`). A batch without
masked tokens selects no row and gives a zero loss and zero gradients (fairseq projects every token
then, against all-pad targets: the same zeros). Same
option (--tpu: fairseq's criterion is used), logging output (loss, ntokens, nsentences, sample_size)
and metrics as fairseq's masked_lm: it subclasses it and keeps reduce_metrics. A model whose LM head is
not fairseq's RobertaLMHead or ours (LSRobertaLMHead) takes fairseq's forward.

Under sequence parallelism (ls_roberta's features are this rank's rows) the target columns are this
rank's and the counts its share: sample_size counts the rank's masked tokens, ntokens and nsentences
come from SP rank 0 only, so that fairseq's sums over all ranks count everything once.
"""
from dataclasses import dataclass

from fairseq.criterions import register_criterion
from fairseq.criterions.masked_lm import MaskedLmConfig, MaskedLmLoss
from fairseq.models.roberta.model import RobertaLMHead

from ..modules.lm_head import LSRobertaLMHead, lm_head_transform
from ..modules.packing import recorded_packing
from ..sequence_parallel.sharding import recorded_shard
from .fused_loss import FusedLossMixin


@dataclass
class LsMaskedLmConfig(MaskedLmConfig):
    """Same field as fairseq's: tpu."""


@register_criterion("ls_masked_lm", dataclass=LsMaskedLmConfig)
class LsMaskedLmLoss(FusedLossMixin, MaskedLmLoss):
    eps = 0.0
    ignore_prefix_size = 0
    report_accuracy = False

    def forward(self, model, sample, reduce=True):
        """fairseq's masked_lm forward (reduce is ignored, as fairseq's does) through the fused loss."""
        head = getattr(getattr(model, "encoder", None), "lm_head", None)
        if self.tpu or type(head) not in (RobertaLMHead, LSRobertaLMHead):
            return MaskedLmLoss.forward(self, model, sample, reduce)
        net_output = model(**sample["net_input"], **self.fused_kwargs(model))
        features = net_output[0]  # [B, T, E] (SP: this rank's rows; --ls-packed: the real tokens' [N, E])
        target = self._target(model, net_output, sample)  # (SP: this rank's columns)
        pack = recorded_packing(net_output)
        if pack is not None:
            target = pack.gather(target)
        masked = target.ne(self.padding_idx)
        sample_size = masked.int().sum()
        # the masked rows' flat indices: the one data-dependent size (a sync, as fairseq's boolean index)
        rows = masked.view(-1).nonzero().squeeze(1)
        features = features.reshape(-1, features.size(-1)).index_select(0, rows)
        hidden = lm_head_transform(head, features)
        loss, _, _ = self.fused_loss(hidden, head.weight, target.reshape(-1).index_select(0, rows), bias=head.bias)
        shard = recorded_shard(net_output)
        first = shard is None or shard.rank == 0
        logging_output = {
            "loss": loss.data,
            "ntokens": sample["ntokens"] if first else 0,
            "nsentences": sample["nsentences"] if first else 0,
            "sample_size": sample_size,
        }
        return loss, sample_size, logging_output
