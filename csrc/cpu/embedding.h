// CPU kernels of the embedding family (csrc/cpu/embedding.cpp): raw pointers, one template per storage type.
#pragma once
#include <cstdint>

#include "cpu_common.h"

namespace fls {
namespace cpu {

// out[r, :] = dropout(scale * weight[tokens[r], :] + pos_weight[positions[r], :]) for the n = B*T rows r,
// zeros where tokens[r] == padding_idx. Dropout element index = r * dim + c (flat index into [B, T, E]).
// tokens, positions: [n] int64, already range-checked by the caller (positions unused when pos_weight is
// null); weight: [*, dim] T; pos_weight: [*, dim] T or nullptr; out: [n, dim] T.
template <typename T>
void embedding_fwd(const int64_t* tokens, const int64_t* positions, const T* weight, const T* pos_weight, T* out,
                   int64_t n, int64_t dim, int64_t padding_idx, double scale, const DropoutParams& d);

// Gradient of the rows of a table looked up by `keys`: out[k, :] = mult * sum_{r : keys[r] == k,
// tokens[r] != padding_idx} dropout'(grad[r, :]). Used with keys = tokens, mult = scale (dweight) and
// keys = positions, mult = 1 (dpos_weight). Rows are grouped by a stable sort of the keys and each group is
// summed in row order by one thread, so the result does not depend on the thread count.
// grad: [n, dim] T; keys, tokens: [n] int64 (keys in [0, num_rows)); out: [num_rows, dim] T, every row
// written (zeros where no key names it), so it may be uninitialised memory.
template <typename T>
void embedding_bwd(const T* grad, const int64_t* keys, const int64_t* tokens, T* out, int64_t n, int64_t dim,
                   int64_t num_rows, int64_t padding_idx, double mult, const DropoutParams& d);

}  // namespace cpu
}  // namespace fls
