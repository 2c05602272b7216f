// Kernel interface of the attention family: attention probabilities (scale + key padding / causal masks +
// softmax + dropout) and the head permutations around the attention GEMMs. The params the op layer fills
// (csrc/ops/attention.cpp) and the entry point of each device (csrc/cpu/attention.cpp;
// csrc/cuda/attention_softmax.cu and csrc/cuda/attention_heads.cu). Plain C++, included by the CUDA files.
#pragma once
#include <cstdint>

#include "fls/common.h"
#include "cuda_launcher.h"

namespace fls {

// Dropout coordinates of an attention-probability block (Python: ops.AttentionCoords). The local scores
// [B, H, Tq, Tk] are heads h_off.., queries q_off.., keys k_off.. of a global [B, H_tot, Tq_tot, Tk_tot]; element
// (b, h, i, j) draws stream element drop.offset + ((b*H_tot + h_off + h)*Tq_tot + q_off + i)*Tk_tot + k_off + j.
// The default (H, 0, Tq, 0, Tk, 0) gives drop.offset + the local flat index. H and Tq are the LOCAL sizes, which
// split a row index r = (b*H + h)*Tq + i. Only the dropout stream moves: the masks use local indices.
struct AttentionCoords {
  int64_t H, Tq;  // local heads and queries
  int64_t H_tot, h_off, Tq_tot, q_off, Tk_tot, k_off;
};

// Stream element (without drop.offset) of key 0 of local row (b, h, i). Unsigned: all terms are >= 0 (the op layer
// checks), and a product past 2^63 wraps like the offset arithmetic of every other dropout.
FLS_HD uint64_t attention_row_stream(const AttentionCoords& c, uint64_t b, uint64_t h, uint64_t i) {
  const uint64_t hg = b * static_cast<uint64_t>(c.H_tot) + static_cast<uint64_t>(c.h_off) + h;
  const uint64_t ig = hg * static_cast<uint64_t>(c.Tq_tot) + static_cast<uint64_t>(c.q_off) + i;
  return ig * static_cast<uint64_t>(c.Tk_tot) + static_cast<uint64_t>(c.k_off);
}

// The same for row index r = (b*H + h)*Tq + i (CPU and the general CUDA kernels: one call per row).
FLS_HD uint64_t attention_row_stream(const AttentionCoords& c, int64_t r) {
  const int64_t bh = r / c.Tq;
  return attention_row_stream(c, static_cast<uint64_t>(bh / c.H), static_cast<uint64_t>(bh % c.H),
                              static_cast<uint64_t>(r % c.Tq));
}

// One attention-probability row per (b, h, i): rows = B*H*Tq, each of Tk keys.
// scores, y: [B, H, Tq, Tk] dtype; key_padding_mask: [B, Tk] bool (true = pad) or nullptr; causal: key j
// masked when j > i + (Tk - Tq). y = softmax(scale * scores + masks), saved for backward; out (same shape)
// = y * keep / (1 - p), written only when drop.threshold > 0 (may be null otherwise). A row whose keys are
// all masked gives zeros. Dropout: row r's key j draws stream element drop.offset + attention_row_stream(coords, r)
// + j (the flat index into [B, H, Tq, Tk] under the default coordinates).
struct AttentionSoftmaxFwdParams {
  DType dtype;
  const void* scores;
  const bool* key_padding_mask;
  void* y;
  void* out;
  int64_t B, H, Tq, Tk;
  bool causal;
  double scale;
  DropoutParams drop;
  AttentionCoords coords;
};

// dscores = scale * y * (g - sum_j(g * y)), g = keep * dout / (1 - p), the keep mask regenerated.
// dout, y, dscores: [rows, Tk] dtype (rows = B*H*Tq); the stream as in the forward (coords.H, coords.Tq split a row).
struct AttentionSoftmaxBwdParams {
  DType dtype;
  const void* dout;
  const void* y;
  void* dscores;
  int64_t rows, Tk;
  double scale;
  DropoutParams drop;
  AttentionCoords coords;
};

// The dropped probabilities again from the softmax output: out = y * keep / (1 - p), the keep mask drawn as
// the forward drew it (row r's key j: stream element drop.offset + attention_row_stream(coords, r) + j). y, out:
// [rows, Tk] dtype (rows = B*H*Tq; coords.H, coords.Tq split a row). Backward uses it so that the forward's
// dropped copy, a second [B, H, Tq, Tk] tensor, need not be kept.
struct AttentionDropoutParams {
  DType dtype;
  const void* y;
  void* out;
  int64_t rows, Tk;
  DropoutParams drop;
  AttentionCoords coords;
};

// Token-major qkv [T, B, 3E] plus bias [3E] -> head-major q, k, v [B*H, T, hd] (E = H*hd):
//   q/k/v[((b*H + h)*T + t)*hd + c] = qkv[(t*B + b)*3E + part*E + h*hd + c] + bias[part*E + h*hd + c].
struct QkvBiasSplitParams {
  DType dtype;
  const void* qkv;
  const void* bias;
  void* q;
  void* k;
  void* v;
  int64_t T, B, H, head_dim;
};

// Its backward: dqkv [T, B, 3E] = the inverse permutation of dq, dk, dv ([B*H, T, hd] each), and
// dbias [3E] = column sums of dqkv in a fixed order (deterministic).
struct QkvBiasSplitBwdParams {
  DType dtype;
  const void* dq;
  const void* dk;
  const void* dv;
  void* dqkv;
  void* dbias;
  int64_t T, B, H, head_dim;
};

// Head-major x [B*H, T, hd] -> token-major y [T, B, H*hd].
struct MergeHeadsParams {
  DType dtype;
  const void* x;
  void* y;
  int64_t T, B, H, head_dim;
};

// No CPU merge_heads: on CPU the op layer lets ATen's strided copy do it (csrc/ops/attention.cpp).
namespace cpu {
void attention_softmax_fwd(const AttentionSoftmaxFwdParams& p);
void attention_softmax_bwd(const AttentionSoftmaxBwdParams& p);
void attention_dropout(const AttentionDropoutParams& p);
void qkv_bias_split(const QkvBiasSplitParams& p);
void qkv_bias_split_bwd(const QkvBiasSplitBwdParams& p);
}  // namespace cpu

// CUDA launchers return a cudaError_t as int (0 = ok). Softmax: csrc/cuda/attention_softmax.cu; head
// permutations: csrc/cuda/attention_heads.cu.
namespace cuda {
FLS_CUDA_LAUNCHER int attention_softmax_fwd(const AttentionSoftmaxFwdParams& p, void* stream);
FLS_CUDA_LAUNCHER int attention_softmax_bwd(const AttentionSoftmaxBwdParams& p, void* stream);
FLS_CUDA_LAUNCHER int attention_dropout(const AttentionDropoutParams& p, void* stream);
FLS_CUDA_LAUNCHER int qkv_bias_split(const QkvBiasSplitParams& p, void* stream);
// Floats of scratch memory qkv_bias_split_bwd needs (per-chunk partial column sums of dqkv).
FLS_CUDA_LAUNCHER int64_t qkv_bias_split_bwd_workspace(int64_t rows, int64_t cols);
FLS_CUDA_LAUNCHER int qkv_bias_split_bwd(const QkvBiasSplitBwdParams& p, float* workspace, void* stream);
FLS_CUDA_LAUNCHER int merge_heads(const MergeHeadsParams& p, void* stream);
}  // namespace cuda

}  // namespace fls
