"""One autograd node per Transformer sublayer, composed of the fused ops: the attention sublayer
(`attention.AttentionBlockFunction`) and the FFN sublayer (`feed_forward.FeedForwardBlockFunction`), with
the layer-norm and residual ends they share (`norm`). They call the GEMMs and torch.ops.fairseq_lightseq.*
directly in one Python frame forward and one backward (see attention.py for why); the per-op functions
of fairseq_lightseq.ops stay the tested building blocks and the path for what the blocks do not serve."""
from . import attention, feed_forward  # noqa: F401
from .attention import AttentionBlockConfig, AttentionBlockFunction  # noqa: F401
from .feed_forward import FeedForwardBlockConfig, FeedForwardBlockFunction  # noqa: F401
