// Philox4x32-10 for many consecutive blocks at once: the CPU dropout masks of the attention, bias+act+
// dropout and embedding kernels. The words equal fls::philox4x32_10's (fls/philox.h) bit for bit, so
// the masks equal the CUDA kernels' and the reference's.
#pragma once
#include <cstdint>

#include "cpu_common.h"
#include "fls/philox.h"

namespace fls {
namespace cpu {

// u[k] = word k % 4 of philox4x32_10(group g0 + k / 4, seed) for k < 4 * n: the stream words of the
// 4n elements 4*g0 .. 4*(g0+n)-1. AVX-512 (16 groups per vector) or AVX2 (8) intrinsics, or a
// portable loop, picked at the first call (philox_batch.cpp); whole batches of 16 or 8 groups are
// computed, so callers draw many elements at once rather than a few per call.
void philox_words(uint64_t g0, int64_t n, uint64_t seed, uint32_t* u);

// Words of philox_words needed by dropout_select for n elements (any offset): n + 8 is enough.
inline int64_t dropout_words(int64_t n) { return n + 8; }

// The stream element of element (r, 0) of a [rows, cols] draw: d.offset + r * cols, or with a row map
// (kernels/dropout.h) d.offset + row_map[r] * cols.
inline uint64_t row_stream_start(const DropoutParams& d, const int64_t* row_map, int64_t r, int64_t cols) {
  const int64_t row = row_map != nullptr ? row_map[r] : r;
  return d.offset + static_cast<uint64_t>(row) * static_cast<uint64_t>(cols);
}

// out[j] = keep bit of stream element s0 + j ? kv : dv, j in [0, n): one Philox block per 4 elements,
// keep iff (u >> 8) >= d.threshold (fls/philox.h). u: scratch of >= dropout_words(n) words.
template <typename V>
inline void dropout_select(uint64_t s0, int64_t n, const DropoutParams& d, uint32_t* u, V kv, V dv, V* out) {
  const int64_t lane0 = static_cast<int64_t>(s0 & 3);
  philox_words(s0 >> 2, (lane0 + n + 3) / 4, d.seed, u);
  const uint32_t* w = u + lane0;
  const uint32_t thr = d.threshold;
  for (int64_t j = 0; j < n; ++j) out[j] = (w[j] >> 8) >= thr ? kv : dv;
}

}  // namespace cpu
}  // namespace fls
