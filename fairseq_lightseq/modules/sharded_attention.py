"""Attention over time-sharded inputs: the only sublayer of a sequence-parallel layer that communicates.

Both modes give every rank's rows the single-process result, dropout included: the attention op is
called with the coordinates of its local [B, H_loc, Tq_loc, Tk_loc] scores in the global unpadded
[B, H, Tq, Tk] (ops.AttentionCoords), so each probability draws the Philox element it draws in one
process. Masks: the key padding mask is the full [B, Tk_pad] one (computed from the padded tokens on
every rank); the causal rule stays the op's lower-right one on local indices, which is the global
rule because each rank's keys start at global key 0 (ulysses: all keys; allgather: keys truncated at
the rank's causal horizon).

ulysses (self-attention): the packed [T/P, B, 3, H, hd] projections are exchanged by one all-to-all
into [T, B, 3, H/P, hd] (all rows of this rank's heads); attention runs on full rows; a second
all-to-all returns [T/P, B, H, hd]. Cross-attention: the queries go through the same exchange, and the
keys/values of this rank's heads only are projected from the gathered encoder output.

allgather (LSS): local queries of all heads; keys and values of all ranks gathered (one collective of
the packed K/V; its backward is a reduce-scatter); with a causal mask, keys past the rank's last row
are dropped. Cross-attention needs no exchange: every rank projects keys/values from the gathered
encoder output.

With torch SDPA (the CUDA path) the dropout draws from torch's generator instead (other masks, as in
one process with SDPA).
"""
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import ops
from ..ops.dropout_stream import Dropout
from ..ops.blocks.attention import split_heads
from .multihead_attention import LSMultiheadAttention
from ..sequence_parallel.collectives import all_gather, all_to_all
from ..sequence_parallel.sharding import Shard


def sharded_attention(attn: LSMultiheadAttention, x: Tensor, memory: Optional[Tensor], key_padding_mask: Tensor,
                      causal: bool, dropout: Dropout, q_shard: Shard, k_total: int, right_padded: bool = False
                      ) -> Tensor:
    """One attention sublayer on this rank's rows.

    x: [Tq/P, B, E] this rank's query rows (already normalised for pre-LN); memory: [S_pad, B, E_enc] the
    gathered encoder output for cross-attention, None for self-attention; key_padding_mask: [B, Tk_pad]
    bool (True = pad) over all keys; dropout: the attention-probability draw; q_shard: the query rows'
    shard (self-attention: also the keys'); k_total: the unpadded number of keys; right_padded: every row is
    its real tokens then padding (the shard's own padding rows come last too), so SDPA may leave the padding
    mask out (ops.blocks.attention.sdpa_key_padding_mask). Returns the output
    projection WITHOUT out_proj.bias, [Tq/P, B, E] (the caller adds it with the residual)."""
    if q_shard.mode == "ulysses":
        return _ulysses(attn, x, memory, key_padding_mask, causal, dropout, q_shard, k_total, right_padded)
    return _allgather(attn, x, memory, key_padding_mask, causal, dropout, q_shard, k_total, right_padded)


def _ulysses(attn, x, memory, key_padding_mask, causal, dropout, shard: Shard, k_total, right_padded):
    Tl, B, E = x.shape
    H, hd, P = attn.num_heads, attn.head_dim, shard.size
    Hl = H // P
    h0 = shard.rank * Hl
    mine = slice(h0 * hd, (h0 + Hl) * hd)  # this rank's heads in a projection's output features
    if memory is None:
        b = torch.cat([attn.q_proj.bias[mine], attn.k_proj.bias[mine], attn.v_proj.bias[mine]])
        # [Tl, B, 3, H, hd] -> [T_pad, B, 3, H/P, hd]: one exchange for q, k and v together
        qkv = all_to_all(_project(x, attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight).view(Tl, B, 3, H, hd),
                         3, 0, shard.group)
        q, k, v = ops.qkv_bias_split(qkv.reshape(shard.padded, B, 3 * Hl * hd), b, Hl)  # [B*Hl, T_pad, hd]
    else:
        qh = all_to_all(F.linear(x, attn.q_proj.weight, attn.q_proj.bias).view(Tl, B, H, hd), 2, 0, shard.group)
        q = split_heads(qh.reshape(shard.padded, B, Hl * hd), Hl)
        k = split_heads(F.linear(memory, attn.k_proj.weight[mine], attn.k_proj.bias[mine]), Hl)
        v = split_heads(F.linear(memory, attn.v_proj.weight[mine], attn.v_proj.bias[mine]), Hl)
    coords = ops.AttentionCoords(H, h0, shard.total, 0, k_total, 0)
    out = _attend(attn, q, k, v, key_padding_mask, causal, dropout, coords, B, right_padded)  # [T_pad, B, Hl*hd]
    # [T_pad, B, H/P, hd] -> [Tl, B, H, hd]: every rank's heads for this rank's rows
    out = all_to_all(out.view(shard.padded, B, Hl, hd), 0, 2, shard.group)
    return F.linear(out.reshape(Tl, B, E), attn.out_proj.weight)


def _allgather(attn, x, memory, key_padding_mask, causal, dropout, shard: Shard, k_total, right_padded):
    Tl, B, E = x.shape
    H = attn.num_heads
    if memory is None:
        b = torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias])
        qkv = _project(x, attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight)
        q, k, v = ops.qkv_bias_split(qkv, b, H)  # [B*H, Tl, hd]
        kv = all_gather(torch.stack([k, v]), 2, shard.group)  # [2, B*H, T_pad, hd]
        # keys after this rank's last row never reach its queries under the causal mask
        keys = shard.stop if causal else shard.padded
        k, v = kv[0, :, :keys], kv[1, :, :keys]
        key_padding_mask = key_padding_mask[:, :keys]
    else:
        q = split_heads(F.linear(x, attn.q_proj.weight, attn.q_proj.bias), H)
        k = split_heads(F.linear(memory, attn.k_proj.weight, attn.k_proj.bias), H)
        v = split_heads(F.linear(memory, attn.v_proj.weight, attn.v_proj.bias), H)
    coords = ops.AttentionCoords(H, 0, shard.total, shard.start, k_total, 0)
    out = _attend(attn, q, k, v, key_padding_mask, causal, dropout, coords, B, right_padded)
    return F.linear(out, attn.out_proj.weight)


def _project(x: Tensor, *weights: Tensor) -> Tensor:
    """[T, B, E] -> [T, B, len(weights) * E_out]: the projections without bias, packed. Three GEMMs and a
    copy of their outputs rather than one GEMM with a concatenated weight, whose copy autograd would keep
    for backward (E x 3E per layer, whatever P)."""
    return torch.cat([F.linear(x, w) for w in weights], dim=-1)


def _attend(attn: LSMultiheadAttention, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor, causal: bool,
            dropout: Dropout, coords, B: int, right_padded: bool) -> Tensor:
    """q: [B*H, Tq, hd]; k, v: [B*H, Tk, hd] (k, v may be strided) -> merged heads [Tq, B, H*hd], through the
    module's own attention (explicit with the coordinates, or SDPA)."""
    BH, _, hd = q.shape
    heads = [t.view(B, BH // B, -1, hd) for t in (q, k, v)]
    return attn.attend(*heads, key_padding_mask, causal, False, dropout, coords, right_padded)[0]
