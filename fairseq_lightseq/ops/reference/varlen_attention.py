"""Attention over packed rows (sentences end to end, no padding), defined per sentence by the padded
attention's own spec, so that its dropout masks are the padded problem's."""
__all__ = ["VarlenCoords", "varlen_attention"]

from typing import NamedTuple, Optional

import torch

from .attention import AttentionCoords, attention_softmax_dropout


class VarlenCoords(NamedTuple):
    """Where the packed sentences sit in the padded [B, H, Tq, Tk] problem, for the dropout stream only.

    Tq, Tk: the padded query and key lengths; starts: [B, 2] int32 on the device of q, row b = (the first
    padded query row, the first padded key column) of sentence b (past the pads of a left-padded side, 0 on a
    right-padded one). Query i / key j of sentence b then draw the stream element of padded (b, h, starts[b, 0]
    + i, starts[b, 1] + j), so a packed call draws the mask of the padded call. None (the default) stands for
    a right-padded batch: (max_seqlen_q, max_seqlen_k, zeros)."""

    Tq: int
    Tk: int
    starts: torch.Tensor


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                     cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, causal: bool = False,
                     scale: float = 1.0, p: float = 0.0, seed: int = 0, offset: int = 0,
                     coords: Optional[VarlenCoords] = None) -> torch.Tensor:
    """dropout(softmax(scale * q k^T + masks)) v, per sentence and head.

    q: [Nq, H, D]; k, v: [Nk, H, D]; cu_seqlens_q / _k: [B+1] int offsets of each sentence's rows;
    max_seqlen_q / _k: the padded lengths of the default coordinates. Sentence b is
    attention_softmax_dropout on its own [1, H, Lq, Lk] scores (causal: query i sees keys j <= i + Lk - Lq),
    with coordinates AttentionCoords(H, 0, Tq, q0, Tk, k0) and offset + b*H*Tq*Tk: the stream elements of
    its rows in the padded problem (VarlenCoords). Math in fp32 (fp64); returns [Nq, H, D], q's dtype.
    """
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    H = q.shape[1]
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    Tq, Tk, starts = (max(max_seqlen_q, 1), max(max_seqlen_k, 1), None) if coords is None else coords
    starts = [[0, 0]] * (len(cq) - 1) if starts is None else starts.tolist()
    out = []
    for b in range(len(cq) - 1):
        qb = q[cq[b]:cq[b + 1]].to(acc).transpose(0, 1)  # [H, Lq, D]
        kb = k[ck[b]:ck[b + 1]].to(acc).transpose(0, 1)
        vb = v[ck[b]:ck[b + 1]].to(acc).transpose(0, 1)
        scores = torch.matmul(qb, kb.transpose(1, 2)).unsqueeze(0)  # [1, H, Lq, Lk]
        c = AttentionCoords(H, 0, Tq, starts[b][0], Tk, starts[b][1])
        probs = attention_softmax_dropout(scores, None, causal, scale, p, seed, offset + b * H * Tq * Tk, c)
        out.append(torch.matmul(probs[0], vb).transpose(0, 1))  # [Lq, H, D]
    return torch.cat(out).to(q.dtype) if out else q.new_empty(q.shape)
