"""RoBERTa's masked-LM head on the fused ops, with fairseq's RobertaLMHead parameters (same keys:
`dense`, `layer_norm`, `weight` (the token embedding unless --untie-weights-roberta), `bias` [V]).

    hidden = layer_norm(act(dense(features)))      # GEMM, then ops.bias_act_dropout, ops.layer_norm
    logits = hidden @ weight.T + bias

The criterion (`ls_masked_lm`) takes `transform` and fuses the last line with the loss
(ops.linear_label_smoothed_cross_entropy with its bias), so training keeps no [masked tokens, V]
logits; `forward` is fairseq's, for the hub interface (fill_mask) and fairseq's own masked_lm.
"""
from typing import Optional

import torch.nn.functional as F
from torch import Tensor

from fairseq.models.roberta.model import RobertaLMHead

from .. import ops
from .transformer_layer import ops_activation


def lm_head_transform(head: RobertaLMHead, features: Tensor) -> Tensor:
    """layer_norm(act(dense(features))) [..., E] of a RobertaLMHead: ours on the fused ops, fairseq's
    through its own modules."""
    if isinstance(head, LSRobertaLMHead):
        return head.transform(features)
    return head.layer_norm(head.activation_fn(head.dense(features)))


class LSRobertaLMHead(RobertaLMHead):
    """fairseq's RobertaLMHead whose dense + activation + layer norm run the fused ops."""

    def __init__(self, embed_dim: int, output_dim: int, activation_fn: str, weight=None):
        super().__init__(embed_dim, output_dim, activation_fn, weight)
        self.activation = ops_activation(str(activation_fn))

    def transform(self, features: Tensor) -> Tensor:
        """features [..., E] -> layer_norm(act(features @ dense.weight.T + dense.bias)) [..., E], same dtype."""
        x = F.linear(features, self.dense.weight)
        x = ops.bias_act_dropout(x, self.dense.bias, 0.0, self.activation)
        return ops.layer_norm(x, self.layer_norm.weight, self.layer_norm.bias, self.layer_norm.eps)

    def forward(self, features: Tensor, masked_tokens: Optional[Tensor] = None, **kwargs) -> Tensor:
        """fairseq's: logits [..., V] of the features (only the masked_tokens' rows when given)."""
        if masked_tokens is not None:
            features = features[masked_tokens, :]
        return F.linear(self.transform(features), self.weight, self.bias)
