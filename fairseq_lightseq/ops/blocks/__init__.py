"""One autograd node per Transformer sublayer, composed of the fused ops: the attention sublayer
(`attention.attention_block`) and the FFN sublayer (`feed_forward.feed_forward_block`), with
the layer-norm and residual ends they share (`norm`, for the SDPA path). Their forward and backward are
compiled ops of their own (COMPILED_OPS, csrc/ops/blocks.cpp) calling the GEMMs and the fused ops from
C++ (the SDPA path: one Python frame; see attention.py for why); the per-op functions of
fairseq_lightseq.ops stay the tested building blocks and the path for what the blocks do not serve."""
from . import attention, feed_forward  # noqa: F401

from .attention import AttentionBlockConfig, AttentionBlockFunction, attention_block  # noqa: F401
from .feed_forward import FeedForwardBlockConfig, feed_forward_block  # noqa: F401

# The blocks' compiled ops: compositions of the other ops, serving these Functions, not a public op.
COMPILED_OPS = ("attention_block_fwd", "attention_block_bwd", "ffn_block_fwd", "ffn_block_bwd")
