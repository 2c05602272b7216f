"""The fused projection + loss that every ls criterion computes (fairseq's criteria keep their
options, logging and metrics; this mixin replaces how the loss is computed).

The fused path (reduce=True, a fairseq transformer decoder whose output layer is its bias-free
`output_projection`, no adaptive softmax): the model runs with `features_only=True`, and
ops.linear_label_smoothed_cross_entropy(features [N, E], output_projection.weight [V, E], target [N],
eps, reduction="sum") projects and takes the loss chunk by chunk of rows, computing the gradients of
the features and of the weight in forward; they, not the logits, are what backward keeps ([N, E] +
[V, E] fp32 instead of [N, V]). With shared input/output embeddings the weight is the embedding matrix
itself, so its two gradients add up as before. eps is the label smoothing (0 for plain cross entropy:
the loss is then the nll). --report-accuracy takes the argmax of each chunk's logits. Without grad
(validation) only the loss is computed.

Everything else takes the logits path, the decoder's full logits and the fused loss op: reduce=False,
adaptive softmax, a decoder that is not a fairseq transformer decoder or overrides output_layer, an
output projection with a bias; `compute_loss`/`compute_accuracy` called with logits (fairseq's API)
also take it. Under sequence parallelism it is the criterion that takes a rank's target columns and
counts its share: the features (like the logits) are this rank's rows. With --ls-packed the model returns
the features of the real target tokens only (packed rows, `fused_kwargs`), and their targets are gathered
in the same order.

A criterion class puts FusedLossMixin before fairseq's criterion and sets `eps`, `ignore_prefix_size`,
`report_accuracy` and `LOGS_NLL` (whether fairseq's logging output has "nll_loss"). The masked LM
(ls_masked_lm) has no decoder: it keeps its own forward (the LM head's masked rows, its projection's
bias) and takes `fused_loss` and `_target` (a rank's target columns) from here.
"""
from fairseq import utils
from fairseq.models.transformer import TransformerDecoderBase
from torch import nn

from ..modules.packing import recorded_packing
from ..ops import label_smoothed_cross_entropy, linear_label_smoothed_cross_entropy
from ..sequence_parallel.sharding import recorded_shard


class FusedLossMixin:
    LOGS_NLL = True

    def _uses_loss_op(self, model):
        """Whether a loss from the logits takes the fused loss op (else fairseq's own math: an adaptive
        softmax's output is no logits)."""
        decoder = getattr(model, "decoder", None)
        return getattr(decoder, "adaptive_softmax", None) is None

    @staticmethod
    def projection_weight(model):
        """The decoder's output projection weight [V, E] when its logits are exactly
        features @ weight.T (fairseq's TransformerDecoderBase.output_layer on a bias-free nn.Linear,
        no adaptive softmax), so the fused projection + loss may replace them; else None."""
        decoder = getattr(model, "decoder", None)  # through fairseq's DDP wrapper too (it proxies attributes)
        projection = getattr(decoder, "output_projection", None)
        if (not isinstance(decoder, TransformerDecoderBase) or decoder.adaptive_softmax is not None
                or type(decoder).output_layer is not TransformerDecoderBase.output_layer
                or type(projection) is not nn.Linear or projection.bias is not None):
            return None
        return projection.weight

    def forward(self, model, sample, reduce=True):
        """fairseq's forward; under sequence parallelism (the decoder returned this rank's rows) the
        counts are this rank's share, so that fairseq's sums over all ranks count everything once:
        ntokens and sample_size are the local target tokens, nsentences (and sample_size under
        --sentence-avg) come from SP rank 0 only. With reduce=True and a plain projection, the model
        returns features [B, T, E] and the fused projection + loss runs (see the module docstring)."""
        weight = self.projection_weight(model) if reduce else None
        # features_only only when set: a model outside the fused path may not take the argument
        net_output = model(**sample["net_input"], **(self.fused_kwargs(model) if weight is not None else {}))
        shard = recorded_shard(net_output)
        if shard is None:
            return self._outputs(model, net_output, sample, reduce, weight)
        ntokens = int(self._target(model, net_output, sample).ne(self.padding_idx).sum())
        nsentences = sample["target"].size(0) if shard.rank == 0 else 0
        counts = {"ntokens": ntokens, "nsentences": nsentences}
        return self._outputs(model, net_output, sample, reduce, weight, counts,
                             nsentences if self.sentence_avg else ntokens)

    def fused_kwargs(self, model) -> dict:
        """The model's arguments for the fused path: features_only, and packed_rows for a model with --ls-packed
        on (the features then come as the real tokens' rows [N, E], so the projection and the loss run on no
        pad row; with --ignore-prefix-size the prefix's rows are there and their targets ignored)."""
        if getattr(model, "ls_packed", False):
            return {"features_only": True, "packed_rows": True}
        return {"features_only": True}

    def _outputs(self, model, net_output, sample, reduce, weight, counts=None, sample_size=None):
        """(loss, sample_size, logging_output) as fairseq's forward computes them, with the counts given.
        weight: the output projection's [V, E] when net_output[0] holds features, else None (logits)."""
        loss, nll_loss, argmax, target = self.loss_and_nll(model, net_output, sample, reduce, weight)
        if counts is None:
            counts = {"ntokens": sample["ntokens"], "nsentences": sample["target"].size(0)}
            sample_size = counts["nsentences"] if self.sentence_avg else counts["ntokens"]
        logging_output = {"loss": loss.data, **({"nll_loss": nll_loss.data} if self.LOGS_NLL else {}), **counts,
                          "sample_size": sample_size}
        if self.report_accuracy:
            if weight is not None:
                n_correct, total = self._accuracy(argmax, target)
            else:
                n_correct, total = self.compute_accuracy(model, net_output, sample)
            logging_output["n_correct"] = utils.item(n_correct.data)
            logging_output["total"] = utils.item(total.data)
        return loss, sample_size, logging_output

    def loss_and_nll(self, model, net_output, sample, reduce, weight):
        """(loss, nll_loss, argmax, target): the fused projection + loss over the features when `weight`
        (projection_weight's) is given, with each row's argmax under --report-accuracy, and the target
        it used; else compute_loss over the logits (argmax and target None)."""
        if weight is None:
            return (*self.compute_loss(model, net_output, sample, reduce=reduce), None, None)
        features, target = self.get_logits_and_target(model, net_output, sample)
        return (*self.fused_loss(features, weight, target), target)

    def fused_loss(self, features, weight, target, bias=None):
        """(loss_sum, nll_sum, argmax [N] or None): the fused projection + loss of features [N, E] by
        weight [V, E] (+ bias [V]) against target [N], pads ignored, with this criterion's eps and
        --report-accuracy."""
        loss, nll_loss, *argmax = linear_label_smoothed_cross_entropy(
            features, weight, target, self.eps, ignore_index=self.padding_idx, reduction="sum",
            return_argmax=self.report_accuracy, bias=bias)
        return loss, nll_loss, argmax[0] if argmax else None

    def _target(self, model, net_output, sample):
        """The target [B, T] int64, or under sequence parallelism this rank's columns of it (padded with
        pad tokens like the decoder's input, so the padding adds nothing to the loss)."""
        target = model.get_targets(sample, net_output)
        shard = recorded_shard(net_output)
        if shard is not None:
            target = shard.local(shard.pad(target, self.padding_idx))
        return target

    def get_logits_and_target(self, model, net_output, sample):
        """net_output[0] as [N, last] (the logits [N, V] in the model's dtype, or the features [N, E]
        when the model ran with features_only) and target [N] int64, with the ignored prefix cut off."""
        logits = net_output[0]
        target = self._target(model, net_output, sample)
        pack = recorded_packing(net_output)
        if pack is not None:  # packed rows: the targets of the real tokens, in the same order
            if self.ignore_prefix_size > 0:
                # the prefix's rows stay in the packed features and their targets become pads, which the loss
                # ignores: the same tokens drop out as in fairseq's cut of the first columns, without
                # gathering the other rows of [N, E] again
                target = target.clone()
                target[:, :self.ignore_prefix_size] = self.padding_idx
            return logits, pack.gather(target)
        if self.ignore_prefix_size > 0:
            logits = logits[:, self.ignore_prefix_size:, :]
            target = target[:, self.ignore_prefix_size:]
        return logits.reshape(-1, logits.size(-1)), target.reshape(-1)

    def _logits_loss(self, model, net_output, sample):
        """(loss [N], nll_loss [N]) fp32 from the logits by the fused loss op (0 at ignored targets)."""
        logits, target = self.get_logits_and_target(model, net_output, sample)
        return label_smoothed_cross_entropy(logits, target, self.eps, ignore_index=self.padding_idx)

    def compute_accuracy(self, model, net_output, sample):
        if not self._uses_loss_op(model):
            return super().compute_accuracy(model, net_output, sample)
        logits, target = self.get_logits_and_target(model, net_output, sample)
        return self._accuracy(logits.argmax(1), target)

    def _accuracy(self, argmax, target):
        """(n_correct, total) over the non-padding tokens; argmax, target: [N] int64. The argmax of the
        logits is the argmax of the log-probs: no log_softmax needed. A masked sum rather than fairseq's
        masked_select, whose data-dependent size would cost a device sync."""
        mask = target.ne(self.padding_idx)
        return argmax.eq(target).logical_and(mask).sum(), mask.sum()
