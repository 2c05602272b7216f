"""Multi-head attention over the fused ops, with fairseq's parameter layout.

Parameters are the four `nn.Linear`s of fairseq's MultiheadAttention (`q_proj`, `k_proj`, `v_proj`,
`out_proj`, each `.weight` [E, E] and `.bias` [E]) so that state_dicts interchange with fairseq's
transformer key for key. The GEMMs run without bias (`F.linear(x, W)`): the q/k/v biases are added
by `ops.qkv_bias_split` (self-attention) and the output bias by the caller's
`ops.bias_dropout_residual`, i.e. `forward` returns the output projection WITHOUT its bias.

q/k/v weights are concatenated with `torch.cat` at every forward (one [3E, E] copy, negligible next
to the GEMM it feeds) rather than stored fused: keeping three separate Parameters means no
state_dict hooks, optimizers see the same parameters as in fairseq, and checkpoints need no
conversion in either direction.
"""
import functools
import math
from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fairseq.incremental_decoding_utils import with_incremental_state
from fairseq.modules import FairseqDropout

from .. import ops
from ..ops import dropout_stream, flash_attention
from ..ops.blocks.attention import sdpa_mask, sdpa_key_padding_mask, sdpa_supported
from . import packing
from .packing import Packing

# Which attention runs (--ls-attention, an attention module's `attention_mode`), one choice for padded and
# packed batches:
# - "explicit": our kernels everywhere (the explicit bmm -> ops.attention_softmax_dropout -> bmm path on padded
#   rows, ops.varlen_attention on packed rows): every attention-dropout mask from our Philox stream, the padded
#   and packed runs' the same;
# - "sdpa" / "flash": torch's fused kernels everywhere: torch's scaled_dot_product_attention on padded rows (on
#   CUDA it picks FlashAttention-2 where it applies), torch's flash varlen kernel on packed rows
#   (ops.flash_attention). On the CPU torch has no kernel for packed rows: models.common turns packing off for
#   "sdpa" (an explicit --ls-packed True is refused), and where flash does not apply (CPU, fp32, a GPU older
#   than sm_80, head dim) packed rows run our kernel with one warning (use_flash);
# - "auto": torch's flash varlen kernel on packed rows where it applies (CUDA), ours elsewhere; SDPA on padded
#   rows on CUDA, and on the CPU when the attention has no dropout and its scores are at least
#   CPU_SDPA_MIN_SCORES per (sentence, head).
# torch's kernels draw attention dropout from torch's RNG, not our Philox stream; both are valid dropout, they
# are just different masks. On the CPU without dropout SDPA is the same math and keeps no [B, H, Tq, Tk] tensor
# for backward (our explicit path keeps the softmax output: at T = 2048 more than fairseq keeps in all, whose
# CPU path runs SDPA); with dropout torch's CPU SDPA falls back to its math path, which keeps more than our
# kernels, so the explicit path stays.
ATTENTION_MODES = ("auto", "sdpa", "flash", "explicit")
# Tq * Tk below which the CPU keeps the explicit path without dropout too: for short rows (translation's
# sentences, a decoding step's one query) torch's CPU SDPA costs more host time per call than it saves,
# and their probabilities are a small part of what a layer keeps. From 128 x 128 (language-model blocks,
# RoBERTa) SDPA keeps no [B, H, Tq, Tk] tensor. The measurements are in the benchmark results.
CPU_SDPA_MIN_SCORES = 128 * 128

IncrementalState = Dict[str, Dict[str, Optional[Tensor]]]


def use_sdpa(x: Tensor, dropout_p: float, Tq: Optional[int] = None, Tk: Optional[int] = None,
             mode: str = "auto") -> bool:
    """Whether attention on x's device with attention dropout probability dropout_p (0 when not applied)
    and Tq queries over Tk keys (None: long enough) runs torch's fused SDPA under attention mode `mode`
    (one of ATTENTION_MODES, see above)."""
    if mode == "explicit":
        return False
    if mode in ("sdpa", "flash"):
        return True
    return x.is_cuda or (dropout_p == 0.0 and (Tq is None or Tq * Tk >= CPU_SDPA_MIN_SCORES))


def use_flash(x: Tensor, head_dim: int, mode: str = "auto") -> bool:
    """Whether attention over packed rows of x's device and dtype (the q/k/v dtype) with this head dim runs
    torch's flash varlen kernel under attention mode `mode` (see ATTENTION_MODES), else our varlen kernel. Where
    flash does not apply, "sdpa" and "flash" warn once per reason, and so does "auto" on CUDA (a GPU user expects
    flash there); "auto" on the CPU is our kernel's home."""
    return _flash_choice(x.device, x.dtype, head_dim, mode)


@functools.lru_cache(maxsize=None)
def _flash_choice(device: torch.device, dtype: torch.dtype, head_dim: int, mode: str) -> bool:
    if mode == "explicit":
        return False
    problem = flash_attention.flash_problem(device, dtype, head_dim)
    if problem is not None and (mode != "auto" or device.type == "cuda"):
        flash_attention.warn_fallback(problem)
    return problem is None


@with_incremental_state
class LSMultiheadAttention(nn.Module):
    """Self- or encoder-decoder attention. Time-major like fairseq: query [Tq, B, E], key [Tk, B, E].

    attention_mode: one of ATTENTION_MODES, whether torch's SDPA or the explicit path runs (the model sets
    it from --ls-attention)."""

    attention_mode = "auto"

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, self_attention: bool = True,
                 kdim: Optional[int] = None):
        super().__init__()
        if embed_dim % num_heads != 0:
            raise ValueError(f"embed_dim {embed_dim} must be divisible by num_heads {num_heads}")
        kdim = kdim or embed_dim
        if self_attention and kdim != embed_dim:
            raise ValueError("self-attention needs kdim == embed_dim")
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.scaling = self.head_dim ** -0.5
        # p and fairseq's inference switch (--retain-dropout), named as fairseq's MultiheadAttention's
        self.dropout_module = FairseqDropout(dropout, module_name="MultiheadAttention")
        self.self_attention = self_attention
        self.encoder_decoder_attention = not self_attention
        # fairseq's order (k, v, q, out): the parameter order, which positional optimizer state in
        # checkpoints follows, and the random draws of the initialisation are then fairseq's.
        self.k_proj = nn.Linear(kdim, embed_dim)
        self.v_proj = nn.Linear(kdim, embed_dim)
        self.q_proj = nn.Linear(embed_dim, embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)
        self.reset_parameters(qkv_same_dim=kdim == embed_dim)

    @property
    def dropout_active(self) -> bool:
        """Whether attention dropout is applied (the one place that decides): in training, or at inference
        once fairseq-generate --retain-dropout[-modules] switched on this module's FairseqDropout."""
        return self.training or self.dropout_module.apply_during_inference

    def reset_parameters(self, qkv_same_dim: bool = True):
        """fairseq's initialisation: scaled xavier for the q/k/v weights when they share a dim, their
        biases keep nn.Linear's default, the output bias starts at zero."""
        gain = 1 / math.sqrt(2) if qkv_same_dim else 1.0
        for lin in (self.k_proj, self.v_proj, self.q_proj):
            nn.init.xavier_uniform_(lin.weight, gain=gain)
        nn.init.xavier_uniform_(self.out_proj.weight)
        nn.init.zeros_(self.out_proj.bias)

    # ---- head split helpers -------------------------------------------------------------------

    def _split(self, x: Tensor) -> Tensor:
        """[T, B, E] -> [B, H, T, hd] (contiguous)."""
        T, B, _ = x.shape
        return x.view(T, B, self.num_heads, self.head_dim).permute(1, 2, 0, 3).contiguous()

    def _project_q(self, query: Tensor) -> Tensor:
        q = F.linear(query, self.q_proj.weight, self.q_proj.bias)
        return self._split(q)

    def _project_kv(self, key: Tensor) -> Tuple[Tensor, Tensor]:
        w = torch.cat([self.k_proj.weight, self.v_proj.weight], dim=0)
        b = torch.cat([self.k_proj.bias, self.v_proj.bias], dim=0)
        kv = F.linear(key, w, b)
        k, v = kv.chunk(2, dim=-1)
        return self._split(k), self._split(v)

    def _project_qkv(self, x: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        """Self-attention: one [3E, E] GEMM, then the fused bias add + head split."""
        T, B, _ = x.shape
        w = torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight], dim=0)
        b = torch.cat([self.q_proj.bias, self.k_proj.bias, self.v_proj.bias], dim=0)
        q, k, v = ops.qkv_bias_split(F.linear(x, w), b, self.num_heads)  # each [B*H, T, hd]
        shape = (B, self.num_heads, T, self.head_dim)
        return q.view(shape), k.view(shape), v.view(shape)

    # ---- forward -------------------------------------------------------------------------------

    def forward(self, query: Tensor, key: Optional[Tensor] = None, key_padding_mask: Optional[Tensor] = None,
                causal: bool = False, incremental_state: Optional[IncrementalState] = None,
                need_weights: bool = False, attn_dropout: Optional[ops.Dropout] = None,
                right_padded: bool = False) -> Tuple[Tensor, Optional[Tensor]]:
        """
        query: [Tq, B, E]; key: [Tk, B, kdim] (encoder-decoder attention; ignored for self-attention);
        key_padding_mask: [B, Tk] bool, True at padding (for self-attention with incremental_state:
        the mask of the new steps only, or None); causal: query i sees keys j <= i + Tk - Tq.
        incremental_state: fairseq's generation cache; self-attention appends the new keys/values,
        encoder-decoder attention projects the encoder output once and reuses it.
        attn_dropout: the draw over the [B, H, Tq, Tk] probabilities (default: p = self.dropout_module.p with
        a fresh seed when dropout is active). right_padded: every row is its real tokens then padding
        and the keys are whole rows (no incremental state): SDPA may then leave the padding mask out
        (ops.blocks.attention.sdpa_key_padding_mask).
        Returns (output projection WITHOUT out_proj.bias [Tq, B, E], attention weights averaged over
        heads [B, Tq, Tk] if need_weights else None).
        """
        Tq, B, E = query.shape
        saved = self._get_input_buffer(incremental_state) if incremental_state is not None else None
        if self.self_attention:
            q, k, v = self._project_qkv(query)
            if saved is not None:
                if "prev_key" in saved:
                    prev_len = saved["prev_key"].size(2)
                    k = torch.cat([saved["prev_key"], k], dim=2)
                    v = torch.cat([saved["prev_value"], v], dim=2)
                    prev_mask = saved.get("prev_key_padding_mask")
                    if prev_mask is not None or key_padding_mask is not None:
                        if prev_mask is None:
                            prev_mask = key_padding_mask.new_zeros(B, prev_len)
                        if key_padding_mask is None:
                            key_padding_mask = prev_mask.new_zeros(B, Tq)
                        key_padding_mask = torch.cat([prev_mask, key_padding_mask.to(torch.bool)], dim=1)
                saved = {"prev_key": k, "prev_value": v, "prev_key_padding_mask": key_padding_mask}
                self._set_input_buffer(incremental_state, saved)
        else:
            q = self._project_q(query)
            if saved is not None and "prev_key" in saved:
                k, v = saved["prev_key"], saved["prev_value"]
            else:
                assert key is not None, "encoder-decoder attention needs `key`"
                k, v = self._project_kv(key)
                if incremental_state is not None:
                    self._set_input_buffer(incremental_state, {"prev_key": k, "prev_value": v})
        if attn_dropout is None:
            attn_dropout = dropout_stream.draw(self.dropout_module.p, self.dropout_active)
        out, weights = self.attend(q, k, v, key_padding_mask, causal, need_weights, attn_dropout,
                                    right_padded=right_padded and incremental_state is None)
        return F.linear(out, self.out_proj.weight), weights

    def forward_packed(self, query: Tensor, key: Optional[Tensor], q_pack: Packing, k_pack: Packing, causal: bool,
                       attn_dropout: ops.Dropout) -> Tensor:
        """Attention over packed rows (--ls-packed): query [Nq, E] of the sentences of q_pack; key [Nk, kdim]
        of k_pack (encoder-decoder attention) or None (self-attention: keys from query, k_pack is q_pack);
        causal: query i of a sentence sees its keys j <= i. attn_dropout: the padded attention's draw, placed
        by packing.coords so that every kept probability is the padded run's. Returns the output projection
        WITHOUT out_proj.bias, [Nq, E].

        torch's flash varlen kernel where use_flash says so under attention_mode (its attention dropout draws
        from torch's CUDA generator), else our varlen_attention (the padded run's Philox mask); neither keeps a
        [B, H, Tq, Tk] tensor for backward."""
        N, H, hd = query.size(0), self.num_heads, self.head_dim
        if self.self_attention:
            w = torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight], dim=0)
            b = torch.cat([self.q_proj.bias, self.k_proj.bias, self.v_proj.bias], dim=0)
            q, k, v = F.linear(query, w, b).view(N, 3, H, hd).unbind(1)
        else:
            q = F.linear(query, self.q_proj.weight, self.q_proj.bias).view(N, H, hd)
            w = torch.cat([self.k_proj.weight, self.v_proj.weight], dim=0)
            b = torch.cat([self.k_proj.bias, self.v_proj.bias], dim=0)
            k, v = F.linear(key, w, b).view(key.size(0), 2, H, hd).unbind(1)
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        if use_flash(q, hd, self.attention_mode):
            out = flash_attention.flash_varlen_attention(q, k, v, q_pack.cu_seqlens, k_pack.cu_seqlens,
                                                         q_pack.max_len, k_pack.max_len, causal, self.scaling,
                                                         attn_dropout.p)
        else:
            out = ops.varlen_attention(q, k, v, q_pack.cu_seqlens, k_pack.cu_seqlens, q_pack.max_len,
                                       k_pack.max_len, causal, self.scaling, attn_dropout,
                                       coords=packing.coords(q_pack, k_pack))
        return F.linear(out.reshape(N, H * hd), self.out_proj.weight)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Optional[Tensor], causal: bool,
                need_weights: bool, attn_dropout: ops.Dropout, coords: Optional[ops.AttentionCoords] = None,
                right_padded: bool = False) -> Tuple[Tensor, Optional[Tensor]]:
        """q: [B, H, Tq, hd]; k, v: [B, H, Tk, hd] -> ([Tq, B, E], weights [B, Tq, Tk] or None). coords: where
        these scores sit in a larger problem (sequence parallelism), for the explicit path's dropout;
        right_padded: see forward (SDPA only; the explicit path keeps the mask)."""
        B, H, Tq, hd = q.shape
        Tk = k.size(2)
        sdpa_kpm = sdpa_key_padding_mask(key_padding_mask, causal, right_padded)
        sdpa = use_sdpa(q, attn_dropout.p, Tq, Tk, self.attention_mode)  # a decoding step (Tq = 1) on the CPU: explicit
        # with a padding mask, sdpa_mask builds the causal band explicitly, for any Tq and Tk
        if not need_weights and sdpa and (sdpa_kpm is not None or sdpa_supported(causal, Tq, Tk)):
            # Fused attention: no [B, H, Tq, Tk] tensor in memory (masks: see sdpa_mask).
            mask, is_causal = sdpa_mask(sdpa_kpm, causal, Tq, Tk, q.device)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=attn_dropout.p,
                                                 is_causal=is_causal, scale=self.scaling)
            return out.permute(2, 0, 1, 3).reshape(Tq, B, H * hd), None
        scores = torch.bmm(q.reshape(B * H, Tq, hd), k.reshape(B * H, Tk, hd).transpose(1, 2)).view(B, H, Tq, Tk)
        if Tq == 1 and attn_dropout.p == 0.0 and not torch.is_grad_enabled() and not q.is_cuda:
            # A decoding step on the CPU: fairseq's own softmax over the one query's keys (every key is
            # visible to the last position; a hypothesis always has a real key). torch's softmax is faster
            # than our kernel on rows this short, and there is no dropout or backward to fuse.
            if key_padding_mask is not None:
                scores = scores.masked_fill(key_padding_mask.view(B, 1, 1, Tk).to(torch.bool), float("-inf"))
            probs = torch.softmax(scores * self.scaling, dim=-1)
            weights = probs.mean(dim=1) if need_weights else None
            return ops.merge_heads(torch.matmul(probs, v).view(B * H, Tq, hd), H), weights
        if not need_weights:
            # probabilities and their product with v in one node: it keeps the softmax output, not the
            # dropped probabilities too (see ops.attention_softmax_dropout_bmm)
            out = ops.attention_softmax_dropout_bmm(scores, v, key_padding_mask, causal, self.scaling, attn_dropout,
                                                    coords=coords)
            return ops.merge_heads(out.view(B * H, Tq, hd), H), None
        probs = ops.attention_softmax_dropout(scores, key_padding_mask, causal, self.scaling, attn_dropout,
                                              coords=coords)
        out = torch.bmm(probs.view(B * H, Tq, Tk), v.reshape(B * H, Tk, hd))
        weights = probs.detach().float().mean(dim=1).to(q.dtype)
        return ops.merge_heads(out, H), weights

    # ---- fairseq incremental-state protocol ----------------------------------------------------

    def _get_input_buffer(self, incremental_state: Optional[IncrementalState]) -> Dict[str, Optional[Tensor]]:
        result = self.get_incremental_state(incremental_state, "attn_state")
        return result if result is not None else {}

    def _set_input_buffer(self, incremental_state: IncrementalState, buffer: Dict[str, Optional[Tensor]]):
        return self.set_incremental_state(incremental_state, "attn_state", buffer)

    def reorder_incremental_state(self, incremental_state: IncrementalState, new_order: Tensor):
        """Beam search: select the cached keys/values (all [B, ...]) of the surviving hypotheses.

        Encoder-decoder attention skips a reorder that keeps the batch size, as fairseq's
        MultiheadAttention does: its cache is projected from the encoder output, which the generator
        repeats for each beam of a sentence, and a same-size new_order only moves hypotheses among the
        beams of their own sentence, so the selected rows equal the rows they replace. (When sentences
        finish, the batch shrinks and the rows are selected.) That saves two [B, H, S, hd] copies per
        layer and step."""
        buffer = self._get_input_buffer(incremental_state)
        if buffer and self.encoder_decoder_attention and all(
                v is None or v.size(0) == new_order.size(0) for v in buffer.values()):
            return incremental_state
        if buffer:
            for name, value in buffer.items():
                if value is not None:
                    buffer[name] = value.index_select(0, new_order)
            incremental_state = self._set_input_buffer(incremental_state, buffer)
        return incremental_state

    def set_beam_size(self, beam_size: int):
        """fairseq calls this before beam search; nothing to do (the cache is reordered in full)."""

    def upgrade_state_dict_named(self, state_dict, name):
        """Old fairseq checkpoints store a fused in_proj_weight/in_proj_bias: split into q/k/v."""
        prefix = name + "." if name != "" else ""
        for kind in ("weight", "bias"):
            key = prefix + "in_proj_" + kind
            if key in state_dict:
                q, k, v = state_dict.pop(key).chunk(3, dim=0)
                state_dict[prefix + "q_proj." + kind] = q
                state_dict[prefix + "k_proj." + kind] = k
                state_dict[prefix + "v_proj." + kind] = v
