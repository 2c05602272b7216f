"""Transformer encoder and decoder for fairseq, built from the fused-op layers.

They subclass fairseq's TransformerEncoderBase / TransformerDecoderBase, so everything that is not
arithmetic is fairseq's own code: the `version` buffers, `embed_tokens`/`embed_positions`/
`layernorm_embedding`/`layer_norm`/`output_projection` modules (same keys, shapes and
initialisation), `reorder_encoder_out`, `max_positions`, `upgrade_state_dict_named`, the output
projection. Only the layers (`build_*_layer`) and the forward passes are replaced.

Unsupported fairseq options are rejected by `models.common.check_supported` (each model's build_model)
before these classes are built.
"""
from typing import Any, Dict, List, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from fairseq import utils

from fairseq.distributed import fsdp_wrap
from fairseq.models.transformer import TransformerConfig, TransformerDecoderBase, TransformerEncoderBase
from fairseq.modules.checkpoint_activations import checkpoint_wrapper

from .. import ops
from ..ops import dropout_stream
from ..sequence_parallel.collectives import all_gather
from ..sequence_parallel.sharding import EXTRA_KEY, SequenceParallel, Shard, shard_or_none
from . import packing
from .embedding import embed_time_major, position_table
from .packing import Packing
from .transformer_layer import SITES_PER_LAYER, LSTransformerDecoderLayer, LSTransformerEncoderLayer, fused_layer_norm


def _cfg(cfg) -> TransformerConfig:
    return TransformerConfig.from_namespace(cfg)


def _activation_dropout(cfg: TransformerConfig) -> float:
    # fairseq's layers: activation_dropout, or the old relu_dropout when it is 0
    return float(cfg.activation_dropout or cfg.relu_dropout or 0)


def _wrap_layer(layer, cfg):
    """fairseq's own layer wrapping (TransformerEncoderBase.build_encoder_layer): activation
    checkpointing with --checkpoint-activations [--offload-activations], then FSDP wrapping.

    Recomputation in backward gives the same dropout masks: the layer gets its Philox seed and
    sites as arguments, which the checkpoint keeps, and fairseq's CheckpointFunction restores the
    CUDA generator's state (which SDPA's attention dropout uses) for the recomputation
    (fairseq.utils.get_rng_state / set_rng_state); the parameters and the state_dict keys are
    unchanged (the wrapper only replaces `forward`)."""
    checkpoint = bool(cfg.checkpoint_activations)
    if checkpoint:
        layer = checkpoint_wrapper(layer, offload_to_cpu=bool(cfg.offload_activations))
    # as fairseq: a checkpointed layer is always FSDP-wrapped (no-op outside --ddp-backend fully_sharded)
    min_params_to_wrap = cfg.min_params_to_wrap if not checkpoint else 0
    return fsdp_wrap(layer, min_num_params=min_params_to_wrap)


class _DropoutStreamMixin:
    """One Philox seed per encoder/decoder forward: the embedding takes site 0 of its stream, layer
    i the sites 1 + i * SITES_PER_LAYER onwards. One draw from torch's generator per forward (none
    when no dropout is configured) instead of one per dropout call. Also the embedding and the rows
    a forward runs, which sequence parallelism shards."""

    # Set by LSTransformerModel.build_model when --sequence-parallel-size > 1 in a distributed run.
    sequence_parallel: Optional[SequenceParallel] = None

    def _rows(self, tokens: Tensor, shard: Optional[Shard]):
        """The rows this forward runs: (tokens [B, T'], positions [B, T'] or None for fairseq's
        make_positions, a bound of the positions, the attention's key padding mask [B, T_keys]).
        Unsharded: the tokens, None, padding_idx + T, the mask. Sharded: this rank's rows of the padded
        tokens, their positions numbered over whole rows, and the padded mask of all rows."""
        if shard is None:
            return tokens, None, self.padding_idx + tokens.size(1), tokens.eq(self.padding_idx)
        padded = shard.pad(tokens, self.padding_idx)
        positions = utils.make_positions(padded, self.padding_idx)
        return (shard.local(padded), shard.local(positions), self.padding_idx + shard.padded,
                padded.eq(self.padding_idx))

    def _embed(self, tokens: Tensor, positions: Optional[Tensor], max_position: int, seed: Optional[int],
               active: bool, shard: Optional[Shard], pack: Optional[Packing] = None) -> Tensor:
        """dropout([layernorm_embedding](scale * embed_tokens + embed_positions)) as [T', B, E], the
        dropout at site 0 of the forward's stream (moved to the shard's first row; with a Packing, tokens
        and positions are the packed [1, N] and each of the N rows draws its padded row's mask)."""
        project_in = getattr(self, "project_in_dim", None)  # the decoder's, with --decoder-input-dim
        B, E = tokens.size(0), self.embed_tokens.embedding_dim if project_in is None else project_in.out_features
        d = dropout_stream.draw(self.dropout_module.p, active, seed, 0)
        if shard is not None:
            d = shard.token_offset(d, B, E)
        if pack is not None:
            d = dropout_stream.at_rows(d, pack.rows)
        if project_in is not None:
            # fairseq: project_in(scale * lookup) + positions; the op looks up and scales only
            x = project_in(embed_time_major(tokens, self.embed_tokens, None, self.embed_scale, 0.0, active))
            table = position_table(self.embed_positions, max_position)
            if table is not None:
                if positions is None:
                    positions = utils.make_positions(tokens, self.padding_idx)
                x = x + F.embedding(positions.t(), table.to(x.dtype))
            if self.layernorm_embedding is not None:
                x = fused_layer_norm(self.layernorm_embedding, x)
            return ops.dropout(x, d, active)
        if self.layernorm_embedding is None:
            return embed_time_major(tokens, self.embed_tokens, self.embed_positions, self.embed_scale, d, active,
                                    positions=positions, max_position=max_position)
        x = embed_time_major(tokens, self.embed_tokens, self.embed_positions, self.embed_scale, 0.0, active,
                             positions=positions, max_position=max_position)
        return ops.dropout(fused_layer_norm(self.layernorm_embedding, x), d, active)

    @property
    def dropout_active(self) -> bool:
        """Whether dropout is applied (the one place that decides, for the embedding and the seed): in
        training, or at inference once fairseq-generate --retain-dropout[-modules] switched on this
        module's FairseqDropout (FairseqDropout.forward's rule)."""
        return self.training or self.dropout_module.apply_during_inference

    def _embed_packed(self, tokens: Tensor, pack: Packing, seed: Optional[int], active: bool) -> Tensor:
        """The embedding of the real tokens of tokens [B, T] (fairseq's make_positions over the padded rows,
        so left or right padding numbers them as the padded run does): [N, E]."""
        positions = utils.make_positions(tokens, self.padding_idx)
        x = self._embed(pack.gather(tokens).view(1, -1), pack.gather(positions).view(1, -1),
                        self.padding_idx + tokens.size(1), seed, active, None, pack)
        return x.view(pack.N, x.size(-1))

    def _any_dropout(self) -> bool:
        """Whether any dropout probability is set, read from the TransformerConfig fairseq's base class
        keeps (self.cfg: every option with fairseq's default, not the namespace, which an arch function
        may leave without one)."""
        cfg = self.cfg
        return bool(cfg.dropout or cfg.attention_dropout or _activation_dropout(cfg))

    def _forward_seed(self) -> Optional[int]:
        return dropout_stream.next_seed() if self.dropout_active and self.uses_dropout else None


class LSTransformerEncoder(_DropoutStreamMixin, TransformerEncoderBase):
    """Encoder: fused embedding -> N x LSTransformerEncoderLayer -> [layer_norm] (pre-LN)."""

    def __init__(self, cfg, dictionary, embed_tokens, return_fc=False):
        if return_fc:
            raise ValueError(f"{type(self).__name__} does not return fc results (return_fc)")
        super().__init__(_cfg(cfg), dictionary, embed_tokens, return_fc=False)
        self.uses_dropout = self._any_dropout()
        self.dropout_module.module_name = "TransformerEncoder"  # fairseq's name, for --retain-dropout-modules

    def build_encoder_layer(self, cfg):
        layer = LSTransformerEncoderLayer(
            cfg.encoder.embed_dim, cfg.encoder.attention_heads, cfg.encoder.ffn_embed_dim,
            dropout=cfg.dropout, attention_dropout=cfg.attention_dropout,
            activation_dropout=_activation_dropout(cfg), activation_fn=str(cfg.activation_fn),
            normalize_before=cfg.encoder.normalize_before)
        return _wrap_layer(layer, cfg)

    def forward_scriptable(self, src_tokens: Tensor, src_lengths: Optional[Tensor] = None,
                           return_all_hiddens: bool = False, token_embeddings: Optional[Tensor] = None):
        """src_tokens: [B, S] int64 (left or right padded). Returns fairseq's encoder_out dict with
        encoder_out [S, B, E], encoder_padding_mask [B, S] bool; encoder_embedding and fc_results are
        left empty (nothing in the transformer reads them; computing them would cost memory)."""
        if token_embeddings is not None:
            raise ValueError(f"{type(self).__name__} does not take token_embeddings")
        # The mask goes to every layer whether or not the batch has padding: asking would cost a
        # device sync (an all-False mask gives the same result).
        encoder_padding_mask = src_tokens.eq(self.padding_idx)
        seed, active = self._forward_seed(), self.dropout_active
        # Sequence parallelism: this rank embeds and runs its rows of the padded source; the layers'
        # attention gets the padded mask of all rows.
        shard = shard_or_none(self.sequence_parallel, src_tokens.size(1))
        tokens, positions, max_position, layer_mask = self._rows(src_tokens, shard)
        x = self._embed(tokens, positions, max_position, seed, active, shard)
        if self.layernorm_embedding is not None:
            # as fairseq: the embedding layer norm made the pad positions non-zero
            x = x * tokens.ne(self.padding_idx).t().unsqueeze(-1).to(x.dtype)

        encoder_states = [x] if return_all_hiddens else []
        for i, layer in enumerate(self.layers):
            x = layer(x, encoder_padding_mask=layer_mask, dropout_seed=seed, dropout_site=1 + i * SITES_PER_LAYER,
                      shard=shard)
            if return_all_hiddens:
                encoder_states.append(x)
        if self.layer_norm is not None:
            x = fused_layer_norm(self.layer_norm, x)

        src_lengths = (~encoder_padding_mask).sum(dim=1, dtype=torch.int32).reshape(-1, 1).contiguous()
        return {
            "encoder_out": [x],  # S x B x E (sequence parallelism: this rank's S_pad/P rows)
            "encoder_padding_mask": [encoder_padding_mask],  # B x S
            "encoder_embedding": [],
            "encoder_states": encoder_states,
            "fc_results": [],
            "src_tokens": [],
            "src_lengths": [src_lengths],
        }


    def forward_packed(self, src_tokens: Tensor, pack: Packing) -> Tensor:
        """The encoder over packed rows (--ls-packed): src_tokens [B, S] (left or right padded), pack its
        Packing. Returns the output rows [N, E] (after the final layer norm), the padded run's values at the
        real positions; dropout draws the padded run's masks."""
        seed, active = self._forward_seed(), self.dropout_active
        x = self._embed_packed(src_tokens, pack, seed, active)
        for i, layer in enumerate(self.layers):
            x = layer(x, dropout_seed=seed, dropout_site=1 + i * SITES_PER_LAYER, pack=pack)
        if self.layer_norm is not None:
            x = fused_layer_norm(self.layer_norm, x)
        return x


class LSTransformerDecoder(_DropoutStreamMixin, TransformerDecoderBase):
    """Decoder: fused embedding -> N x LSTransformerDecoderLayer -> [layer_norm] -> output projection."""

    # Whether the task pads prev_output_tokens on the right (every row: its real tokens, then padding), so
    # that causal self-attention under SDPA may leave the padding mask out (ops.blocks.attention.
    # sdpa_key_padding_mask). Set at build from the task (models.common.right_padded_targets); False (the
    # mask kept) for a decoder built any other way.
    right_padded: bool = False

    def __init__(self, cfg, dictionary, embed_tokens, no_encoder_attn=False, output_projection=None):
        super().__init__(_cfg(cfg), dictionary, embed_tokens, no_encoder_attn=no_encoder_attn,
                         output_projection=output_projection)
        self.uses_dropout = self._any_dropout()
        self.dropout_module.module_name = "TransformerDecoder"  # fairseq's name, for --retain-dropout-modules

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        layer = LSTransformerDecoderLayer(
            cfg.decoder.embed_dim, cfg.decoder.attention_heads, cfg.decoder.ffn_embed_dim,
            dropout=cfg.dropout, attention_dropout=cfg.attention_dropout,
            activation_dropout=_activation_dropout(cfg), activation_fn=str(cfg.activation_fn),
            normalize_before=cfg.decoder.normalize_before, encoder_embed_dim=cfg.encoder.embed_dim,
            no_encoder_attn=no_encoder_attn)
        return _wrap_layer(layer, cfg)

    def extract_features_scriptable(self, prev_output_tokens: Tensor,
                                    encoder_out: Optional[Dict[str, List[Tensor]]],
                                    incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
                                    full_context_alignment: bool = False, alignment_layer: Optional[int] = None,
                                    alignment_heads: Optional[int] = None):
        """prev_output_tokens: [B, T] int64 (with incremental_state: all tokens so far, only the last
        is fed). Returns (features [B, T, E_out], {"attn": [encoder attention of alignment_layer,
        averaged over heads, [B, T, S]] (None in training), "inner_states": [...]})."""
        bs, slen = prev_output_tokens.size()
        if alignment_layer is None:
            alignment_layer = self.num_layers - 1
        enc: Optional[Tensor] = None
        padding_mask: Optional[Tensor] = None
        if encoder_out is not None and len(encoder_out["encoder_out"]) > 0:
            enc = encoder_out["encoder_out"][0]
        if encoder_out is not None and len(encoder_out["encoder_padding_mask"]) > 0:
            padding_mask = encoder_out["encoder_padding_mask"][0]

        seed, active = self._forward_seed(), self.dropout_active
        shard = shard_or_none(self.sequence_parallel, slen, incremental_state is not None)
        encoder_total = None
        if incremental_state is not None:
            # fairseq: a generation step sits at position padding_idx + slen, whatever the padding
            tokens = prev_output_tokens[:, -1:]
            positions, max_position = torch.full_like(tokens, self.padding_idx + slen), self.padding_idx + slen
            # Always the padding mask (all False without padding): asking would cost a device sync.
            self_attn_padding_mask = tokens.eq(self.padding_idx)
        else:
            tokens, positions, max_position, self_attn_padding_mask = self._rows(prev_output_tokens, shard)
        if shard is not None and enc is not None:
            # every rank's queries see every source row: gathered once for all layers (its backward is
            # one reduce-scatter)
            encoder_total = padding_mask.size(1)
            enc = all_gather(enc, 0, shard.group)
            padding_mask = F.pad(padding_mask, (0, enc.size(0) - padding_mask.size(1)), value=True)
        x = self._embed(tokens, positions, max_position, seed, active, shard)

        attn: Optional[Tensor] = None
        inner_states: List[Optional[Tensor]] = [x]
        for idx, layer in enumerate(self.layers):
            x, layer_attn = layer(x, enc, padding_mask, incremental_state,
                                  self_attn_padding_mask=self_attn_padding_mask,
                                  causal=not full_context_alignment,
                                  need_attn=idx == alignment_layer and not self.training,
                                  dropout_seed=seed, dropout_site=1 + idx * SITES_PER_LAYER, shard=shard,
                                  encoder_total=encoder_total, right_padded=self.right_padded)
            inner_states.append(x)
            if layer_attn is not None and idx == alignment_layer:
                attn = layer_attn.float().to(x)

        if self.layer_norm is not None:
            x = fused_layer_norm(self.layer_norm, x)
        x = x.transpose(0, 1)  # T x B x C -> B x T x C
        if self.project_out_dim is not None:
            x = self.project_out_dim(x)
        extra = {"attn": [attn], "inner_states": inner_states}
        if shard is not None:
            extra[EXTRA_KEY] = shard  # the rows x holds, for the criterion's targets
        return x, extra

    def forward_packed(self, prev_output_tokens: Tensor, pack: Packing, encoder_rows: Optional[Tensor] = None,
                       encoder_pack: Optional[Packing] = None) -> Tensor:
        """The decoder's features over packed rows (--ls-packed): prev_output_tokens [B, T], pack its Packing;
        encoder_rows [N_src, E_enc] the encoder's packed output with its Packing (None without cross-attention).
        Returns the features [N, E_out] (final layer norm and project_out_dim applied, no output projection)."""
        seed, active = self._forward_seed(), self.dropout_active
        x = self._embed_packed(prev_output_tokens, pack, seed, active)
        for idx, layer in enumerate(self.layers):
            x, _ = layer(x, encoder_rows, dropout_seed=seed, dropout_site=1 + idx * SITES_PER_LAYER, pack=pack,
                         encoder_pack=encoder_pack)
        if self.layer_norm is not None:
            x = fused_layer_norm(self.layer_norm, x)
        if self.project_out_dim is not None:
            x = self.project_out_dim(x)
        return x

    def packed_output(self, x: Tensor, pack: Packing):
        """The decoder's output from forward_packed's features x [N, E], for the ls criterion that asked for
        packed rows: the rows as they are, their Packing in the extra output under packing.EXTRA_KEY (no
        attention, no inner states)."""
        return x, {"attn": [None], "inner_states": [], packing.EXTRA_KEY: pack}

    def forward(self, prev_output_tokens, encoder_out=None, incremental_state=None, features_only: bool = False,
                full_context_alignment: bool = False, alignment_layer: Optional[int] = None,
                alignment_heads: Optional[int] = None, src_lengths: Optional[Any] = None,
                return_all_hiddens: bool = False):
        """fairseq's decoder forward: (logits [B, T, V], extra)."""
        x, extra = self.extract_features_scriptable(prev_output_tokens, encoder_out, incremental_state,
                                                    full_context_alignment, alignment_layer, alignment_heads)
        if not features_only:
            x = self.output_layer(x)
        return x, extra
