"""One autograd node per Transformer sublayer, composed of the fused ops: the attention sublayer
(`attention.attention_block`; over packed rows `packed_attention.packed_attention_block`, or on torch's flash
varlen kernel `flash_packed_attention.flash_packed_attention_block`, a Python node) and the FFN sublayer
(`feed_forward.feed_forward_block`, padded or packed rows). Each but the flash one is one
compiled op with a C++ autograd node whose forward and backward call the GEMMs and the fused ops from
C++ (csrc/ops/blocks.cpp; see attention.py for why); the per-op functions of fairseq_lightseq.ops stay
the tested building blocks and the path for what the blocks do not serve."""
from . import attention, feed_forward, flash_packed_attention, packed_attention  # noqa: F401

from .attention import AttentionBlockConfig, attention_block  # noqa: F401
from .feed_forward import FeedForwardBlockConfig, feed_forward_block  # noqa: F401
from .flash_packed_attention import flash_packed_attention_block  # noqa: F401
from .packed_attention import packed_attention_block  # noqa: F401

# The blocks' compiled ops: compositions of the other ops, serving these functions, not public ops.
COMPILED_OPS = ("attention_block", "attention_block_sdpa", "attention_block_fwd", "attention_block_bwd",
                "ffn_block", "ffn_block_fwd", "ffn_block_bwd", "varlen_attention_block", "varlen_attention_block_fwd",
                "varlen_attention_block_bwd")
