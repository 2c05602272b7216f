"""The fused ops as differentiable functions (autograd.Function over torch.ops.fairseq_lightseq.*),
falling back to the reference ops (`fairseq_lightseq.ops.reference`) where no kernel is built."""
from . import reference  # noqa: F401
from . import blocks  # noqa: F401
from ._backend import BUILD_INFO, NO_DROPOUT, Dropout, draw, has_kernel  # noqa: F401
from .adam import adam_step  # noqa: F401
from .reference.attention import AttentionCoords  # noqa: F401
from .attention import attention_softmax_dropout, merge_heads, qkv_bias_split  # noqa: F401
from .cross_entropy import label_smoothed_cross_entropy, linear_label_smoothed_cross_entropy  # noqa: F401
from .dropout import bias_act_dropout, bias_dropout_residual, dropout, dropout_mask  # noqa: F401
from .embedding import embedding  # noqa: F401
from .layer_norm import layer_norm  # noqa: F401
