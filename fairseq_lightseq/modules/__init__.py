"""nn.Modules over the fused ops, with fairseq's transformer parameter layout."""
from .embedding import embed_time_major, position_table  # noqa: F401
from .multihead_attention import LSMultiheadAttention  # noqa: F401
from .transformer import LSTransformerDecoder, LSTransformerEncoder  # noqa: F401
from .transformer_layer import LSTransformerDecoderLayer, LSTransformerEncoderLayer  # noqa: F401
from .lm_head import LSRobertaLMHead  # noqa: F401
