// CPU kernels of the attention family: attention probabilities (scale + key padding / causal masks +
// softmax + dropout) and the head split/merge around the attention GEMMs.
#pragma once
#include <cstdint>

#include "cpu_common.h"

namespace fls {
namespace cpu {

// One attention-probability row per (b, h, i): rows = B*H*Tq, each of Tk keys.
// scores: [B, H, Tq, Tk] T; key_padding_mask: [B, Tk] bool (true = pad) or nullptr;
// causal: key j masked when j > i + (Tk - Tq).
// y: [B, H, Tq, Tk] T, the softmax (saved for backward); out: same shape, the dropped probabilities
// y * keep / (1 - p), written only when d.threshold > 0 (out may be nullptr otherwise).
// A row whose keys are all masked gives zeros. Dropout element e = flat index into [B, H, Tq, Tk].
template <typename T>
void attention_softmax_fwd(const T* scores, const bool* key_padding_mask, T* y, T* out, int64_t B, int64_t H,
                           int64_t Tq, int64_t Tk, bool causal, double scale, const DropoutParams& d);

// dscores = scale * y * (g - sum_j(g * y)), g = keep * dout / (1 - p); the keep mask is regenerated
// from (seed, offset) rather than stored. dout, y, dscores: [rows, Tk] T.
template <typename T>
void attention_softmax_bwd(const T* dout, const T* y, T* dscores, int64_t rows, int64_t Tk, double scale,
                           const DropoutParams& d);

// Token-major -> head-major: for every part p < nparts (q, k, v),
//   out[p][((b*H + h)*T + t)*hd + c] = x[(t*B + b)*row_stride + p*E + h*hd + c] + bias[p*E + h*hd + c]
// with E = H*hd. x: [T, B, row_stride] T; bias: [nparts*E] T; out[p]: [B*H, T, hd] T.
template <typename T>
void split_heads(const T* x, int64_t row_stride, const T* bias, T* const* out, int nparts, int64_t Tlen,
                 int64_t B, int64_t H, int64_t hd);

// The inverse of split_heads without bias: y[(t*B + b)*row_stride + p*E + h*hd + c] = in[p][...].
template <typename T>
void merge_heads(const T* const* in, int nparts, T* y, int64_t row_stride, int64_t Tlen, int64_t B, int64_t H,
                 int64_t hd);

// sums[c] = sum over rows of x[r, c], in row order for every column (deterministic, thread-count
// independent), accumulated in acc_t<T>. x: [rows, cols] T; sums: [cols] T.
template <typename T>
void column_sum(const T* x, T* sums, int64_t rows, int64_t cols);

}  // namespace cpu
}  // namespace fls
