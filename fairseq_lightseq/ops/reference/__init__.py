"""The spec: every fused op written in plain PyTorch. Kernels are tested against these functions,
and they run whenever the compiled library (or its kernel for a device) is absent."""
from .adam import adam_step  # noqa: F401
from .attention import AttentionCoords, attention_softmax_dropout, merge_heads, qkv_bias_split  # noqa: F401
from .cross_entropy import label_smoothed_cross_entropy, linear_label_smoothed_cross_entropy  # noqa: F401
from .dropout import activation, bias_act_dropout, bias_dropout_residual  # noqa: F401
from .embedding import embedding, make_positions  # noqa: F401
from .layer_norm import layer_norm  # noqa: F401
from .philox import dropout, keep_mask  # noqa: F401
