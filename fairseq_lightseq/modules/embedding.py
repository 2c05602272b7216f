"""Token + position embedding through `ops.embedding`, on fairseq's embedding modules.

The parameters stay in fairseq's own modules, so their state_dict keys are fairseq's:
`embed_tokens` (an nn.Embedding, possibly shared between encoder, decoder and output projection)
and `embed_positions` (fairseq's LearnedPositionalEmbedding, whose `.weight` is a parameter, or
SinusoidalPositionalEmbedding, whose `.weights` table is a non-persistent buffer grown on demand).
This module only looks up the position table and calls the fused op, producing the time-major
[T, B, E] layout the layers use directly (no transpose copy).
"""
from typing import Optional, Union

from torch import Tensor, nn

from fairseq import utils
from fairseq.modules import SinusoidalPositionalEmbedding

from .. import ops


def position_table(embed_positions: Optional[nn.Module], max_position: int) -> Optional[Tensor]:
    """The [P, E] table of `embed_positions` covering position index `max_position` (None when there
    are no positional embeddings). Sinusoidal tables grow like fairseq's (rebuilt, never truncated)."""
    if embed_positions is None:
        return None
    if isinstance(embed_positions, SinusoidalPositionalEmbedding):
        if max_position >= embed_positions.weights.size(0):
            embed_positions.weights = SinusoidalPositionalEmbedding.get_embedding(
                max_position + 1, embed_positions.embedding_dim, embed_positions.padding_idx
            ).to(embed_positions.weights)
        return embed_positions.weights
    return embed_positions.weight  # learned: rows padding_idx+1 .. are positions 1..


def embed_time_major(tokens: Tensor, embed_tokens: nn.Embedding, embed_positions: Optional[nn.Module],
                     scale: float, p: Union[float, ops.Dropout], training: bool, positions: Optional[Tensor] = None,
                     max_position: Optional[int] = None) -> Tensor:
    """dropout(scale * embed_tokens(tokens) + embed_positions(positions)) as [T, B, E].

    tokens: [B, T] int64; positions: [B, T] int64 position indices (default: fairseq's
    make_positions, non-pad tokens numbered padding_idx+1.. along each row, pads get padding_idx).
    max_position: an upper bound of `positions` (default padding_idx + T, exact for make_positions;
    a bound rather than positions.max() so that no device sync is needed).
    Pad tokens give zero vectors (fairseq gets the same from the zero pad rows).
    """
    padding_idx = embed_tokens.padding_idx
    if positions is None:
        positions = utils.make_positions(tokens, padding_idx)
    if max_position is None:
        max_position = padding_idx + tokens.size(1)
    table = position_table(embed_positions, max_position)
    weight = embed_tokens.weight
    if table is not None and table.dtype != weight.dtype:
        table = table.to(weight.dtype)
    return ops.embedding(tokens.t().contiguous(), weight, table, padding_idx, scale, p, training,
                         positions=positions.t().contiguous())
