"""Transformer encoder and decoder layers over the fused ops, with fairseq's parameter names.

Each layer owns exactly the submodules of fairseq's TransformerEncoderLayer / TransformerDecoderLayer
(`self_attn`, `self_attn_layer_norm`, [`encoder_attn`, `encoder_attn_layer_norm`], `fc1`, `fc2`,
`final_layer_norm`), so the state_dict keys and shapes are fairseq's. The forward replaces fairseq's
chain of small ops with the fused ones (post-LN shown; pre-LN moves the layer norms):

    attn = self_attn(x)                       # GEMMs; bias of out_proj not yet added
    x = bias_dropout_residual(attn, out_proj.bias, x);  x = layer_norm(x)
    h = bias_act_dropout(fc1(x) without bias, fc1.bias, act)
    x = bias_dropout_residual(fc2(h) without bias, fc2.bias, x);  x = layer_norm(x)
"""
from typing import Optional

import torch.nn.functional as F
from torch import Tensor, nn

from fairseq.modules import FairseqDropout

from .. import ops
from .multihead_attention import IncrementalState, LSMultiheadAttention

# fairseq --activation-fn -> the ops' activation names.
ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "gelu_accurate": "gelu_tanh", "gelu_fast": "gelu_tanh"}


def _layer_norm(ln: nn.LayerNorm, x: Tensor) -> Tensor:
    return ops.layer_norm(x, ln.weight, ln.bias, ln.eps)


class _FeedForwardMixin:
    """Self-attention and fc1 -> bias+act+dropout -> fc2 -> bias+dropout+residual, shared by both
    layers."""

    def _build_common(self, embed_dim: int, num_heads: int, dropout: float,
                      attention_dropout: float, activation_dropout: float, activation_fn: str,
                      normalize_before: bool):
        self.embed_dim = embed_dim
        # fairseq's FairseqDropout modules, under the names fairseq's layers give them: they hold p and
        # the inference switch fairseq-generate --retain-dropout[-modules] sets (make_generation_fast_);
        # the fused ops apply the dropout (see _on).
        self.dropout_module = FairseqDropout(dropout, module_name=self.FAIRSEQ_NAME)
        self.activation_dropout_module = FairseqDropout(activation_dropout, module_name=self.FAIRSEQ_NAME)
        self.activation = _check_activation(activation_fn)
        self.normalize_before = normalize_before
        self.self_attn = LSMultiheadAttention(embed_dim, num_heads, attention_dropout, self_attention=True)
        self.self_attn_layer_norm = nn.LayerNorm(embed_dim)

    def _build_ffn(self, embed_dim: int, ffn_dim: int):
        self.fc1 = nn.Linear(embed_dim, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, embed_dim)
        self.final_layer_norm = nn.LayerNorm(embed_dim)

    def _ffn_block(self, x: Tensor) -> Tensor:
        residual = x
        if self.normalize_before:
            x = _layer_norm(self.final_layer_norm, x)
        act_drop, drop = self.activation_dropout_module, self.dropout_module
        h = ops.bias_act_dropout(F.linear(x, self.fc1.weight), self.fc1.bias, act_drop.p, self.activation,
                                 _on(act_drop, self.training))
        x = ops.bias_dropout_residual(F.linear(h, self.fc2.weight), self.fc2.bias, residual, drop.p,
                                      _on(drop, self.training))
        if not self.normalize_before:
            x = _layer_norm(self.final_layer_norm, x)
        return x

    def _attn_residual(self, attn_out: Tensor, attn: LSMultiheadAttention, residual: Tensor,
                       ln: nn.LayerNorm) -> Tensor:
        x = ops.bias_dropout_residual(attn_out, attn.out_proj.bias, residual, self.dropout_module.p,
                                      _on(self.dropout_module, self.training))
        if not self.normalize_before:
            x = _layer_norm(ln, x)
        return x


def _on(dropout: FairseqDropout, training: bool) -> bool:
    """Whether a dropout applies: in training, or at inference once --retain-dropout enabled it
    (FairseqDropout.forward's rule)."""
    return training or dropout.apply_during_inference


def _check_activation(activation_fn: str) -> str:
    if activation_fn not in ACTIVATIONS:
        raise ValueError(f"ls_transformer: --activation-fn {activation_fn!r} is not supported "
                         f"(supported: {', '.join(ACTIVATIONS)})")
    return ACTIVATIONS[activation_fn]


class LSTransformerEncoderLayer(_FeedForwardMixin, nn.Module):
    """One encoder layer. x: [T, B, E] (time-major, fairseq's layout), any float dtype the ops take."""

    FAIRSEQ_NAME = "TransformerEncoderLayerBase"  # for --retain-dropout-modules

    def __init__(self, embed_dim: int, num_heads: int, ffn_dim: int, dropout: float = 0.1,
                 attention_dropout: float = 0.0, activation_dropout: float = 0.0,
                 activation_fn: str = "relu", normalize_before: bool = False):
        super().__init__()
        self._build_common(embed_dim, num_heads, dropout, attention_dropout, activation_dropout,
                           activation_fn, normalize_before)
        self._build_ffn(embed_dim, ffn_dim)

    def forward(self, x: Tensor, encoder_padding_mask: Optional[Tensor] = None) -> Tensor:
        """x: [T, B, E]; encoder_padding_mask: [B, T] bool, True at padding. Returns [T, B, E]."""
        residual = x
        if self.normalize_before:
            x = _layer_norm(self.self_attn_layer_norm, x)
        attn_out, _ = self.self_attn(x, key_padding_mask=encoder_padding_mask)
        x = self._attn_residual(attn_out, self.self_attn, residual, self.self_attn_layer_norm)
        return self._ffn_block(x)

    def upgrade_state_dict_named(self, state_dict, name):
        """Very old fairseq checkpoints name the norms layer_norms.0/1."""
        for old, new in {"0": "self_attn_layer_norm", "1": "final_layer_norm"}.items():
            for m in ("weight", "bias"):
                k = f"{name}.layer_norms.{old}.{m}"
                if k in state_dict:
                    state_dict[f"{name}.{new}.{m}"] = state_dict.pop(k)


class LSTransformerDecoderLayer(_FeedForwardMixin, nn.Module):
    """One decoder layer: causal self-attention, encoder-decoder attention, FFN. x: [T, B, E]."""

    FAIRSEQ_NAME = "TransformerDecoderLayerBase"  # for --retain-dropout-modules

    def __init__(self, embed_dim: int, num_heads: int, ffn_dim: int, dropout: float = 0.1,
                 attention_dropout: float = 0.0, activation_dropout: float = 0.0,
                 activation_fn: str = "relu", normalize_before: bool = False,
                 encoder_embed_dim: Optional[int] = None, no_encoder_attn: bool = False):
        super().__init__()
        self._build_common(embed_dim, num_heads, dropout, attention_dropout, activation_dropout,
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
                need_attn: bool = False):
        """
        x: [T, B, E] (T = 1 in a generation step); encoder_out: [S, B, E_enc];
        encoder_padding_mask: [B, S] bool; self_attn_padding_mask: [B, T] bool or None;
        causal: mask future positions (off only for full-context alignment).
        Returns (x [T, B, E], encoder attention averaged over heads [B, T, S] if need_attn else None).
        """
        residual = x
        if self.normalize_before:
            x = _layer_norm(self.self_attn_layer_norm, x)
        attn_out, _ = self.self_attn(x, key_padding_mask=self_attn_padding_mask, causal=causal,
                                     incremental_state=incremental_state)
        x = self._attn_residual(attn_out, self.self_attn, residual, self.self_attn_layer_norm)
        attn = None
        if self.encoder_attn is not None and encoder_out is not None:
            residual = x
            if self.normalize_before:
                x = _layer_norm(self.encoder_attn_layer_norm, x)
            attn_out, attn = self.encoder_attn(x, encoder_out, key_padding_mask=encoder_padding_mask,
                                               incremental_state=incremental_state,
                                               need_weights=need_attn and self.need_attn)
            x = self._attn_residual(attn_out, self.encoder_attn, residual, self.encoder_attn_layer_norm)
        return self._ffn_block(x), attn

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
