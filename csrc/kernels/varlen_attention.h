// Kernel interface of the varlen-attention op group: attention over packed rows (sentences laid end to end,
// no padding). The params the op layer fills (csrc/ops/varlen_attention.cpp) and the entry point of each
// device (csrc/cpu/varlen_attention.cpp, csrc/cuda/varlen_attention.cu). Plain C++, included by the CUDA file.
#pragma once
#include <cstdint>

#include "attention.h"
#include "fls/common.h"
#include "cuda_launcher.h"

namespace fls {

// The packed problem both ops share.
//   Sentence b (b < B) owns query rows [cu_seqlens_q[b], cu_seqlens_q[b+1]) of q [Nq, H, D] and key rows
//   [cu_seqlens_k[b], cu_seqlens_k[b+1]) of k, v [Nk, H, D]; cu_seqlens_*: [B+1] int32, cu[0] = 0,
//   non-decreasing, cu[B] = N (the op layer checks this on the CPU; on CUDA a check kernel asserts it).
//   max_seqlen_*: bounds of the lengths, which only size the CUDA grid.
//   causal: query i of a sentence with Lq queries and Lk keys sees keys j <= i + (Lk - Lq) (lower right, the
//   padded attention_softmax's rule; decoder self-attention has Lq == Lk: j <= i); else all Lk keys. A query
//   that sees no key gives zeros.
//   Dropout: probability element (b, h, i, j) draws the stream element the padded attention op draws for it,
//   drop.offset + ((b*H + h)*padded_q + q0 + i)*padded_k + k0 + j, with (q0, k0) = starts[2b], starts[2b+1]:
//   the sentence's first query row and key column in the padded [B, H, padded_q, padded_k] problem (left
//   padding puts them past the pads); starts == nullptr means (0, 0) for every sentence (right padding).
struct VarlenProblem {
  const int32_t* cu_seqlens_q;
  const int32_t* cu_seqlens_k;
  const int32_t* starts;  // [B, 2] or nullptr
  int64_t B, H, D, Nq, Nk, max_seqlen_q, max_seqlen_k, padded_q, padded_k;
  bool causal;
  double scale;
  DropoutParams drop;
};

// End (exclusive) of the keys query i sees, in [0, Lk].
FLS_HD int64_t varlen_key_end(bool causal, int64_t i, int64_t Lq, int64_t Lk) {
  if (!causal) return Lk;
  const int64_t e = i + 1 + (Lk - Lq);
  return e < 0 ? 0 : (e > Lk ? Lk : e);
}

// First query that sees key j (causal: the inverse of varlen_key_end), in [0, Lq].
FLS_HD int64_t varlen_query_begin(bool causal, int64_t j, int64_t Lq, int64_t Lk) {
  if (!causal) return 0;
  const int64_t s = j - (Lk - Lq);
  return s < 0 ? 0 : (s > Lq ? Lq : s);
}

// Stream element (without drop.offset) of key 0 of query i of sentence b, head h: the padded op's
// attention_row_stream with the sentence's place in the padded problem as its coordinates.
FLS_HD uint64_t varlen_row_stream(const VarlenProblem& p, int64_t b, int64_t h, int64_t i) {
  AttentionCoords c;
  c.H = p.H;
  c.Tq = p.padded_q;
  c.H_tot = p.H;
  c.h_off = 0;
  c.Tq_tot = p.padded_q;
  c.q_off = p.starts ? p.starts[2 * b] : 0;
  c.Tk_tot = p.padded_k;
  c.k_off = p.starts ? p.starts[2 * b + 1] : 0;
  return attention_row_stream(c, static_cast<uint64_t>(b), static_cast<uint64_t>(h), static_cast<uint64_t>(i));
}

// out = dropout(softmax(scale * q k^T + masks)) v per (sentence, head); q, out: [Nq, H, D] dtype; k, v: [Nk, H, D]
// dtype; lse: [Nq, H] acc (float64 for kFloat64, else float32), the log-sum-exp of each query's scaled scores
// (-inf for a query that sees no key), saved for backward.
struct VarlenAttentionFwdParams {
  DType dtype;
  const void* q;
  const void* k;
  const void* v;
  void* out;
  void* lse;
  VarlenProblem s;
};

// dq, dk, dv ([Nq|Nk, H, D] dtype) for the upstream gradient dout [Nq, H, D], the probabilities recomputed from
// q, k and lse and the dropout mask regenerated. out: the forward's (CUDA uses rowsum(dP * P) = dout . out).
struct VarlenAttentionBwdParams {
  DType dtype;
  const void* dout;
  const void* q;
  const void* k;
  const void* v;
  const void* out;
  const void* lse;
  void* dq;
  void* dk;
  void* dv;
  VarlenProblem s;
};

namespace cpu {
void varlen_attention_fwd(const VarlenAttentionFwdParams& p);
void varlen_attention_bwd(const VarlenAttentionBwdParams& p);
}  // namespace cpu

// CUDA launchers return a cudaError_t as int (0 = ok). Head dims up to kVarlenMaxHeadDim.
constexpr int64_t kVarlenMaxHeadDim = 256;
namespace cuda {
FLS_CUDA_LAUNCHER int varlen_attention_fwd(const VarlenAttentionFwdParams& p, void* stream);
// Floats of scratch memory varlen_attention_bwd needs (rowsum(dP * P) per query and head).
FLS_CUDA_LAUNCHER int64_t varlen_attention_bwd_workspace(const VarlenProblem& s);
FLS_CUDA_LAUNCHER int varlen_attention_bwd(const VarlenAttentionBwdParams& p, float* workspace, void* stream);
}  // namespace cuda

}  // namespace fls
