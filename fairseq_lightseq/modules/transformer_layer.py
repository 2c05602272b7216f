"""Transformer encoder and decoder layers over the fused ops, with fairseq's parameter names.

Each layer owns exactly the submodules of fairseq's TransformerEncoderLayer / TransformerDecoderLayer
(`self_attn`, `self_attn_layer_norm`, [`encoder_attn`, `encoder_attn_layer_norm`], `fc1`, `fc2`,
`final_layer_norm`), so the state_dict keys and shapes are fairseq's. The forward replaces fairseq's
chain of small ops with the fused ones (post-LN shown; pre-LN moves the layer norms):

    attn = self_attn(x)                       # GEMMs; bias of out_proj not yet added
    x = bias_dropout_residual(attn, out_proj.bias, x);  x = layer_norm(x)
    h = bias_act_dropout(fc1(x) without bias, fc1.bias, act)
    x = bias_dropout_residual(fc2(h) without bias, fc2.bias, x);  x = layer_norm(x)

Training and evaluation without incremental state run each sublayer as one autograd node
(ops.blocks.attention_block, ops.blocks.feed_forward_block: C++ autograd nodes, so backward never enters
Python) instead of ~20 autograd nodes, which decides the host time per step; packed rows (--ls-packed,
modules/packing.py) the same, over [N, E] rows (ops.blocks.packed_attention_block, feed_forward_block with
the row map). The per-op chain above is the same arithmetic and serves incremental decoding, attention
weights, autocast and devices/dtypes without compiled kernels.

Dropout: one seed per encoder/decoder forward (drawn by the caller), and each dropout site of
layer i owns a fixed Philox range (`dropout_site` + k, see ops.dropout_stream.SITE_BITS): the masks do not
depend on call order, so activation checkpointing recomputes them exactly.
"""
import functools
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fairseq.modules import FairseqDropout

from .. import ops
from ..errors import ConfigurationError
from ..ops import dropout_stream
from ..ops.blocks import (AttentionBlockConfig, FeedForwardBlockConfig, attention_block, feed_forward_block,
                          packed_attention_block)
from ..ops.blocks.attention import sdpa_key_padding_mask, sdpa_supported
from ..ops.blocks.flash_packed_attention import flash_packed_attention_block
from ..ops.reference.dropout import ACTIVATIONS
from .sharded_attention import sharded_attention
from ..sequence_parallel.sharding import Shard
from .multihead_attention import IncrementalState, LSMultiheadAttention, use_flash, use_sdpa
from . import packing
from .packing import Packing

# fairseq --activation-fn -> the ops' activation (one of ACTIVATIONS).
FAIRSEQ_ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "gelu_accurate": "gelu_tanh", "gelu_fast": "gelu_tanh"}
assert set(FAIRSEQ_ACTIVATIONS.values()) <= set(ACTIVATIONS)

# Dropout sites per layer in the Philox stream of one forward pass (a decoder layer uses 6).
SITES_PER_LAYER = 8

_BLOCK_OPS = tuple(dict.fromkeys(ops.blocks.attention.OPS + ops.blocks.feed_forward.OPS))
_PACKED_BLOCK_OPS = tuple(dict.fromkeys(ops.blocks.packed_attention.OPS + ops.blocks.feed_forward.OPS))
# The dtypes the compiled kernels take, per device type (csrc/ops/utils.h check_float).
_KERNEL_DTYPES = {"cpu": (torch.float32, torch.float64, torch.bfloat16),
                  "cuda": (torch.float32, torch.float16, torch.bfloat16)}


@functools.lru_cache(maxsize=None)
def _blocks_have_kernels(device_type: str, packed: bool = False) -> bool:
    """Whether every op of the blocks (padded, or packed: the packed attention block and the FFN block) has
    a kernel for this device type (use_kernel warns once otherwise). Cached: asked at every layer call."""
    return all([ops.use_kernel(op, device_type) for op in (_PACKED_BLOCK_OPS if packed else _BLOCK_OPS)])


def fused_layer_norm(ln: nn.LayerNorm, x: Tensor) -> Tensor:
    """x normalised by the fused op with the parameters of fairseq's LayerNorm module `ln`."""
    return ops.layer_norm(x, ln.weight, ln.bias, ln.eps)


class TransformerLayerBase(nn.Module):
    """What both layers share: self-attention and its norm, the FFN and its norm, the dropout draws,
    and the choice between the one-node blocks and the per-op chain.

    recompute_attention: the attention blocks project q, k, v again in backward instead of keeping them
    (AttentionBlockConfig.recompute); the model sets it from --ls-recompute-attention."""

    recompute_attention = False

    def _build_self_attention(self, embed_dim: int, num_heads: int, dropout: float, attention_dropout: float,
                              activation_dropout: float, activation_fn: str, normalize_before: bool):
        self.embed_dim = embed_dim
        # fairseq's FairseqDropout modules, under the names fairseq's layers give them: they hold p and
        # the inference switch fairseq-generate --retain-dropout[-modules] sets (make_generation_fast_);
        # the fused ops apply the dropout (see dropout_active).
        self.dropout_module = FairseqDropout(dropout, module_name=self.FAIRSEQ_NAME)
        self.activation_dropout_module = FairseqDropout(activation_dropout, module_name=self.FAIRSEQ_NAME)
        self.activation = ops_activation(activation_fn)
        self.normalize_before = normalize_before
        self.self_attn = LSMultiheadAttention(embed_dim, num_heads, attention_dropout, self_attention=True)
        self.self_attn_layer_norm = nn.LayerNorm(embed_dim)

    def _build_ffn(self, embed_dim: int, ffn_dim: int):
        self.fc1 = nn.Linear(embed_dim, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, embed_dim)
        self.final_layer_norm = nn.LayerNorm(embed_dim)

    @property
    def dropout_active(self) -> bool:
        """Whether this layer's residual and activation dropout are applied (the one place that decides):
        in training, or at inference once fairseq-generate --retain-dropout[-modules] switched on its
        FairseqDropout modules (FairseqDropout.forward's rule; both carry the layer's fairseq name)."""
        return self.training or self.dropout_module.apply_during_inference

    def _draw(self, p: float, seed: Optional[int], site: int, shard: Optional[Shard] = None,
              x: Optional[Tensor] = None, width: Optional[int] = None, pack: Optional[Packing] = None) -> ops.Dropout:
        """The draw of a dropout site. With a shard, the draw of a token-wise op over this rank's rows of
        x ([T/P, B, E]; `width` replaces E for the FFN's hidden activations). With a Packing, the draw of a
        token-wise op over packed rows [N, C]: each row draws its padded row's mask."""
        d = dropout_stream.draw(p, self.dropout_active, seed, site)
        if pack is not None:
            return dropout_stream.at_rows(d, pack.rows)
        if shard is None:
            return d
        return shard.token_offset(d, x.shape[1], width or x.shape[2])

    def _use_blocks(self, x: Tensor, packed: bool = False) -> bool:
        """The one-node blocks (padded, or over packed rows) need every op's kernel for x's device and one
        dtype throughout; under autocast (mixed dtypes) the per-op chain's promotion rules apply."""
        device_type = x.device.type
        if ops.autocast_on(x) or x.dtype != self.fc1.weight.dtype or \
                x.dtype not in _KERNEL_DTYPES.get(device_type, ()):
            return False
        return _blocks_have_kernels(device_type, packed)

    def _attention_block(self, attn: LSMultiheadAttention, ln: nn.LayerNorm, x: Tensor, memory: Optional[Tensor],
                         key_padding_mask: Optional[Tensor], causal: bool, seed: Optional[int], site: int,
                         right_padded: bool = False) -> Tensor:
        """right_padded: see LSTransformerDecoderLayer.forward; under SDPA the block then gets no padding mask
        (sdpa_key_padding_mask), and its C++ sdpa_mask uses SDPA's causal flag."""
        Tk = x.shape[0] if memory is None else memory.shape[0]
        attn_dropout = dropout_stream.draw(attn.dropout_module.p, attn.dropout_active, seed, site)
        cfg = AttentionBlockConfig(
            attn.num_heads, attn.scaling, causal, self.normalize_before, ln.eps, attn_dropout,
            self._draw(self.dropout_module.p, seed, site + 1),
            use_sdpa(x, attn_dropout.p, x.shape[0], Tk, attn.attention_mode) and sdpa_supported(causal, x.shape[0], Tk, compiled=True),
            self.recompute_attention)
        if cfg.sdpa:
            key_padding_mask = sdpa_key_padding_mask(key_padding_mask, causal, right_padded)
        q, k, v, o = attn.q_proj, attn.k_proj, attn.v_proj, attn.out_proj
        return attention_block(x, memory, key_padding_mask, ln.weight, ln.bias, q.weight, q.bias, k.weight, k.bias,
                               v.weight, v.bias, o.weight, o.bias, cfg)

    def _ffn_block(self, x: Tensor, seed: Optional[int], site: int, shard: Optional[Shard] = None,
                   pack: Optional[Packing] = None) -> Tensor:
        """The FFN sublayer as one node; x: [T, B, E], or packed rows [N, E] with their Packing."""
        ln = self.final_layer_norm
        cfg = FeedForwardBlockConfig(self.activation,
                                     self._draw(self.activation_dropout_module.p, seed, site, shard, x,
                                                self.fc1.out_features, pack),
                                     self._draw(self.dropout_module.p, seed, site + 1, shard, x, pack=pack),
                                     self.normalize_before, ln.eps)
        return feed_forward_block(x, ln.weight, ln.bias, self.fc1.weight, self.fc1.bias, self.fc2.weight,
                                  self.fc2.bias, cfg)

    # ---- the per-op chain -----------------------------------------------------------------------

    def _attention_chain(self, attn: LSMultiheadAttention, ln: nn.LayerNorm, x: Tensor, seed: Optional[int],
                         site: int, shard: Optional[Shard] = None, **attn_kwargs):
        """Returns (x [T, B, E], attention weights or None). With a shard (sequence parallelism), x is
        this rank's rows and attn_kwargs are sharded_attention's (memory, key_padding_mask, causal, k_total,
        right_padded)."""
        residual = x
        if self.normalize_before:
            x = fused_layer_norm(ln, x)
        attn_dropout = dropout_stream.draw(attn.dropout_module.p, attn.dropout_active, seed, site)
        if shard is None:
            attn_out, weights = attn(x, attn_dropout=attn_dropout, **attn_kwargs)
        else:
            attn_out, weights = sharded_attention(attn, x, dropout=attn_dropout, q_shard=shard, **attn_kwargs), None
        x = ops.bias_dropout_residual(attn_out, attn.out_proj.bias, residual,
                                      self._draw(self.dropout_module.p, seed, site + 1, shard, residual))
        if not self.normalize_before:
            x = fused_layer_norm(ln, x)
        return x, weights

    def _attention_packed(self, attn: LSMultiheadAttention, ln: nn.LayerNorm, x: Tensor, seed: Optional[int],
                          site: int, pack: Packing, memory: Optional[Tensor] = None,
                          memory_pack: Optional[Packing] = None, causal: bool = False) -> Tensor:
        """The attention sublayer over packed rows: x [Nq, E] (queries, the residual), memory [Nk, E_enc]
        with its Packing for encoder-decoder attention (None: self-attention over x's own rows).
        Returns [Nq, E]. The dropout masks are the padded sublayer's (packing.coords, Packing.rows), except the
        attention's on torch's flash kernel (use_flash: torch's CUDA generator).
        One node (ops.blocks.packed_attention_block, or flash_packed_attention_block) where its kernels serve x,
        else the per-op chain."""
        k_pack = memory_pack or pack
        if self._use_blocks(x, packed=True):
            cfg = AttentionBlockConfig(
                attn.num_heads, attn.scaling, causal, self.normalize_before, ln.eps,
                dropout_stream.draw(attn.dropout_module.p, attn.dropout_active, seed, site),
                self._draw(self.dropout_module.p, seed, site + 1, pack=pack), recompute=self.recompute_attention)
            q, k, v, o = attn.q_proj, attn.k_proj, attn.v_proj, attn.out_proj
            weights = (ln.weight, ln.bias, q.weight, q.bias, k.weight, k.bias, v.weight, v.bias, o.weight, o.bias)
            if use_flash(x, attn.head_dim, attn.attention_mode):
                return flash_packed_attention_block(x, memory, pack.cu_seqlens, k_pack.cu_seqlens, pack.max_len,
                                                    k_pack.max_len, *weights, cfg)
            return packed_attention_block(x, memory, pack.cu_seqlens, k_pack.cu_seqlens, pack.max_len, k_pack.max_len,
                                          packing.coords(pack, k_pack), *weights, cfg)
        residual = x
        if self.normalize_before:
            x = fused_layer_norm(ln, x)
        attn_dropout = dropout_stream.draw(attn.dropout_module.p, attn.dropout_active, seed, site)
        attn_out = attn.forward_packed(x, memory, pack, k_pack, causal, attn_dropout)
        x = ops.bias_dropout_residual(attn_out, attn.out_proj.bias, residual,
                                      self._draw(self.dropout_module.p, seed, site + 1, pack=pack))
        if not self.normalize_before:
            x = fused_layer_norm(ln, x)
        return x

    def _ffn_chain(self, x: Tensor, seed: Optional[int], site: int, shard: Optional[Shard] = None,
                   pack: Optional[Packing] = None) -> Tensor:
        """The FFN sublayer as the per-op chain; x: [T, B, E], or packed rows [N, E] with their Packing."""
        residual = x
        if self.normalize_before:
            x = fused_layer_norm(self.final_layer_norm, x)
        h = ops.bias_act_dropout(F.linear(x, self.fc1.weight), self.fc1.bias,
                                 self._draw(self.activation_dropout_module.p, seed, site, shard, x, self.fc1.out_features,
                                            pack), self.activation)
        x = ops.bias_dropout_residual(F.linear(h, self.fc2.weight), self.fc2.bias, residual,
                                      self._draw(self.dropout_module.p, seed, site + 1, shard, residual, pack=pack))
        if not self.normalize_before:
            x = fused_layer_norm(self.final_layer_norm, x)
        return x

    def _ffn(self, x: Tensor, seed: Optional[int], site: int, shard: Optional[Shard] = None,
             pack: Optional[Packing] = None) -> Tensor:
        """The FFN sublayer: token-wise, so a shard only moves its dropout offsets, and packed rows draw
        their padded rows' masks."""
        if self._use_blocks(x, packed=pack is not None):
            return self._ffn_block(x, seed, site, shard, pack)
        return self._ffn_chain(x, seed, site, shard, pack)

    def _seed(self, seed: Optional[int]) -> Optional[int]:
        """The forward's seed, or one drawn here when the layer is called on its own with dropout on."""
        if seed is None and self.dropout_active and (self.dropout_module.p or self.activation_dropout_module.p or self.self_attn.dropout_module.p):
            seed = dropout_stream.next_seed()
        return seed


def ops_activation(activation_fn: str, model: str = "fairseq_lightseq") -> str:
    """The ops' name for fairseq's --activation-fn `activation_fn`; ConfigurationError naming `model` (the
    registered model whose options are checked) and the supported values otherwise."""
    if activation_fn not in FAIRSEQ_ACTIVATIONS:
        raise ConfigurationError(f"{model} does not support --activation-fn {activation_fn}; "
                                 f"supported: {', '.join(FAIRSEQ_ACTIVATIONS)}")
    return FAIRSEQ_ACTIVATIONS[activation_fn]


class LSTransformerEncoderLayer(TransformerLayerBase):
    """One encoder layer. x: [T, B, E] (time-major, fairseq's layout), any float dtype the ops take."""

    FAIRSEQ_NAME = "TransformerEncoderLayerBase"  # for --retain-dropout-modules

    def __init__(self, embed_dim: int, num_heads: int, ffn_dim: int, dropout: float = 0.1,
                 attention_dropout: float = 0.0, activation_dropout: float = 0.0,
                 activation_fn: str = "relu", normalize_before: bool = False):
        super().__init__()
        self._build_self_attention(embed_dim, num_heads, dropout, attention_dropout, activation_dropout,
                           activation_fn, normalize_before)
        self._build_ffn(embed_dim, ffn_dim)

    def forward(self, x: Tensor, encoder_padding_mask: Optional[Tensor] = None, dropout_seed: Optional[int] = None,
                dropout_site: int = 0, shard: Optional[Shard] = None, pack: Optional[Packing] = None) -> Tensor:
        """x: [T, B, E]; encoder_padding_mask: [B, T] bool, True at padding; dropout_seed: the forward's
        Philox seed (None: drawn here if dropout is on); dropout_site: this layer's first dropout
        site (4 used); shard: with sequence parallelism, the rows x holds ([T_pad/P, B, E]; the mask
        is then the padded [B, T_pad] one); pack: x is packed rows [N, E] of this Packing (the mask is
        not used). Returns x's shape."""
        seed, k = self._seed(dropout_seed), dropout_site
        if pack is not None:
            x = self._attention_packed(self.self_attn, self.self_attn_layer_norm, x, seed, k, pack)
            return self._ffn(x, seed, k + 2, pack=pack)
        if shard is not None:
            x, _ = self._attention_chain(self.self_attn, self.self_attn_layer_norm, x, seed, k, shard, memory=None,
                                         key_padding_mask=encoder_padding_mask, causal=False, k_total=shard.total)
            return self._ffn(x, seed, k + 2, shard)
        if self._use_blocks(x):
            x = self._attention_block(self.self_attn, self.self_attn_layer_norm, x, None, encoder_padding_mask,
                                      False, seed, k)
            return self._ffn_block(x, seed, k + 2)
        x, _ = self._attention_chain(self.self_attn, self.self_attn_layer_norm, x, seed, k,
                                     key_padding_mask=encoder_padding_mask)
        return self._ffn_chain(x, seed, k + 2)

    def upgrade_state_dict_named(self, state_dict, name):
        """Very old fairseq checkpoints name the norms layer_norms.0/1."""
        for old, new in {"0": "self_attn_layer_norm", "1": "final_layer_norm"}.items():
            for m in ("weight", "bias"):
                k = f"{name}.layer_norms.{old}.{m}"
                if k in state_dict:
                    state_dict[f"{name}.{new}.{m}"] = state_dict.pop(k)


class LSTransformerDecoderLayer(TransformerLayerBase):
    """One decoder layer: causal self-attention, encoder-decoder attention, FFN. x: [T, B, E]."""

    FAIRSEQ_NAME = "TransformerDecoderLayerBase"  # for --retain-dropout-modules

    def __init__(self, embed_dim: int, num_heads: int, ffn_dim: int, dropout: float = 0.1,
                 attention_dropout: float = 0.0, activation_dropout: float = 0.0,
                 activation_fn: str = "relu", normalize_before: bool = False,
                 encoder_embed_dim: Optional[int] = None, no_encoder_attn: bool = False):
        super().__init__()
        self._build_self_attention(embed_dim, num_heads, dropout, attention_dropout, activation_dropout,
                           activation_fn, normalize_before)
        if no_encoder_attn:
            self.encoder_attn = None
            self.encoder_attn_layer_norm = None
        else:
            self.encoder_attn = LSMultiheadAttention(embed_dim, num_heads, attention_dropout,
                                                     self_attention=False, kdim=encoder_embed_dim or embed_dim)
            self.encoder_attn_layer_norm = nn.LayerNorm(embed_dim)
        self._build_ffn(embed_dim, ffn_dim)
        self.need_attn = True

    def forward(self, x: Tensor, encoder_out: Optional[Tensor] = None,
                encoder_padding_mask: Optional[Tensor] = None,
                incremental_state: Optional[IncrementalState] = None,
                self_attn_padding_mask: Optional[Tensor] = None, causal: bool = True,
                need_attn: bool = False, dropout_seed: Optional[int] = None, dropout_site: int = 0,
                shard: Optional[Shard] = None, encoder_total: Optional[int] = None, right_padded: bool = False,
                pack: Optional[Packing] = None, encoder_pack: Optional[Packing] = None):
        """
        x: [T, B, E] (T = 1 in a generation step); encoder_out: [S, B, E_enc];
        encoder_padding_mask: [B, S] bool; self_attn_padding_mask: [B, T] bool or None;
        causal: mask future positions (off only for full-context alignment); dropout_seed,
        dropout_site: as the encoder layer's (6 sites used). shard: with sequence parallelism, the
        rows x holds ([T_pad/P, B, E]; self_attn_padding_mask is then [B, T_pad], encoder_out the
        gathered [S_pad, B, E_enc] with its [B, S_pad] mask, encoder_total = S). right_padded: every row of x
        is its real tokens then padding (the decoder decides, from the task: LSTransformerDecoder.right_padded);
        causal self-attention under SDPA then leaves the padding mask out (sdpa_key_padding_mask says why
        that is exact for every row that reaches the loss). Ignored with incremental_state.
        pack: x is packed rows [N, E] of this Packing, encoder_out the encoder's packed rows [N_src, E_enc] of
        encoder_pack (the masks, incremental_state and need_attn are not used; causal self-attention).
        Returns (x [T, B, E], encoder attention averaged over heads [B, T, S] if need_attn else None).
        """
        seed, k = self._seed(dropout_seed), dropout_site
        cross = self.encoder_attn is not None and encoder_out is not None
        if pack is not None:
            x = self._attention_packed(self.self_attn, self.self_attn_layer_norm, x, seed, k, pack, causal=True)
            if cross:
                x = self._attention_packed(self.encoder_attn, self.encoder_attn_layer_norm, x, seed, k + 2, pack,
                                           encoder_out, encoder_pack)
            return self._ffn(x, seed, k + 4, pack=pack), None
        right_padded = right_padded and incremental_state is None
        if shard is not None:
            x, _ = self._attention_chain(self.self_attn, self.self_attn_layer_norm, x, seed, k, shard, memory=None,
                                         key_padding_mask=self_attn_padding_mask, causal=causal, k_total=shard.total,
                                         right_padded=right_padded)
            if cross:
                x, _ = self._attention_chain(self.encoder_attn, self.encoder_attn_layer_norm, x, seed, k + 2, shard,
                                             memory=encoder_out, key_padding_mask=encoder_padding_mask, causal=False,
                                             k_total=encoder_total)
            return self._ffn(x, seed, k + 4, shard), None
        need_weights = need_attn and self.need_attn
        if incremental_state is None and not (cross and need_weights) and self._use_blocks(x):
            x = self._attention_block(self.self_attn, self.self_attn_layer_norm, x, None, self_attn_padding_mask,
                                      causal, seed, k, right_padded)
            if cross:
                x = self._attention_block(self.encoder_attn, self.encoder_attn_layer_norm, x, encoder_out,
                                          encoder_padding_mask, False, seed, k + 2)
            return self._ffn_block(x, seed, k + 4), None
        x, _ = self._attention_chain(self.self_attn, self.self_attn_layer_norm, x, seed, k,
                                     key_padding_mask=self_attn_padding_mask, causal=causal,
                                     incremental_state=incremental_state, right_padded=right_padded)
        attn = None
        if cross:
            x, attn = self._attention_chain(self.encoder_attn, self.encoder_attn_layer_norm, x, seed, k + 2,
                                            key=encoder_out, key_padding_mask=encoder_padding_mask,
                                            incremental_state=incremental_state, need_weights=need_weights)
        return self._ffn_chain(x, seed, k + 4), attn

    def make_generation_fast_(self, need_attn: bool = False, **kwargs):
        self.need_attn = need_attn

    def upgrade_state_dict_named(self, state_dict, name):
        """Very old fairseq checkpoints name the norms layer_norms.0/1/2."""
        for old, new in {"0": "self_attn_layer_norm", "1": "encoder_attn_layer_norm",
                         "2": "final_layer_norm"}.items():
            for m in ("weight", "bias"):
                k = f"{name}.layer_norms.{old}.{m}"
                if k in state_dict:
                    state_dict[f"{name}.{new}.{m}"] = state_dict.pop(k)
