// CUDA launchers of the embedding family (csrc/cuda/embedding.cu). Plain C++ declarations so the ATen
// wrapper can include them without CUDA headers; each returns a cudaError_t as int (0 = ok).
#pragma once
#include <cstdint>

#include "fls/common.h"

namespace fls {
namespace cuda {

// out[r, :] = dropout(scale * weight[tokens[r], :] + pos_weight[positions[r], :]), zeros where
// tokens[r] == padding_idx; dropout element index r * dim + c. tokens, positions: [n] int64, range-checked
// by the caller (positions unused when pos_weight is null); weight, pos_weight: [*, dim] dt; out: [n, dim] dt.
int embedding_fwd(DType dt, const int64_t* tokens, const int64_t* positions, const void* weight,
                  const void* pos_weight, void* out, int64_t n, int64_t dim, int64_t padding_idx, double scale,
                  DropoutParams d, void* stream);

// gd[r, c] = grad[r, c] * dropout factor of element r * dim + c (float32), so that the segment sums
// below need no random numbers. grad: [n, dim] dt; gd: [n, dim] float32.
int embedding_bwd_dropout(DType dt, const void* grad, float* gd, int64_t n, int64_t dim, DropoutParams d,
                          void* stream);

// out[seg_keys[s], :] = mult * sum_{i in [seg_offsets[s], seg_offsets[s+1])} src[sorted_rows[i], :], summed
// in i order (deterministic), for segments with seg_keys[s] >= 0 (a negative key marks rows that give no
// gradient, e.g. pad tokens). src: [n, dim], dt storage or float32 when src_is_float; sorted_rows: [n] int64;
// seg_offsets: [num_segments + 1] int64; seg_keys: [num_segments] int64; out: [*, dim] dt, zero-filled by the
// caller (rows no segment names stay zero).
int embedding_bwd_segments(DType dt, const void* src, bool src_is_float, const int64_t* sorted_rows,
                           const int64_t* seg_offsets, const int64_t* seg_keys, int64_t num_segments, void* out,
                           int64_t dim, double mult, void* stream);

}  // namespace cuda
}  // namespace fls
