// The last step of every backward that sums over rows (dbias, dweight): out[c] = sum over chunks k of
// partial[k, c], where each chunk's partial row was written by the op's own backward kernel. The
// order of the additions depends only on the chunk count (the shape), never on timing, so the
// result is run-to-run identical without atomics: a block covers kSumCols columns with kSumGroups
// groups of threads; group g adds chunks g, g + kSumGroups, ... in order, then group 0 adds the
// group sums in order. Layer norm sums two partial arrays (dweight, dbias) in the same launch.
#pragma once
#include "dtype.cuh"
#include "launch.cuh"
#include "shared_memory.cuh"

namespace fls {
namespace cuda {
namespace {

constexpr int kSumCols = 32, kSumGroups = 16;

// The partition of `rows` rows into chunks for the partial sums: about target_chunks chunks of at least
// min_rows rows each. It depends on the shape only, never on the device or timing.
inline int64_t rows_per_chunk(int64_t rows, int64_t target_chunks, int64_t min_rows) {
  const int64_t r = (rows + target_chunks - 1) / target_chunks;
  return r > min_rows ? r : min_rows;
}
inline int64_t chunk_count(int64_t rows, int64_t rows_per_chunk) {
  return (rows + rows_per_chunk - 1) / rows_per_chunk;
}

// out0[c] = sum_k p0[k * cols + c] and, when p1 is not null, out1[c] likewise from p1.
template <typename T>
__global__ void __launch_bounds__(kSumCols* kSumGroups)
    column_sums_kernel(const float* __restrict__ p0, T* __restrict__ out0, const float* __restrict__ p1,
                       T* __restrict__ out1, int64_t chunks, int64_t cols) {
  FLS_SHARED(float, s0, [kSumGroups][kSumCols]);
  FLS_SHARED(float, s1, [kSumGroups][kSumCols]);
  const int tc = threadIdx.x % kSumCols, g = threadIdx.x / kSumCols;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kSumCols + tc;
  float a0 = 0.f, a1 = 0.f;
  if (c < cols) {
    // Unrolled so that several chunk loads are in flight (the adds stay in k order).
#pragma unroll 8
    for (int64_t k = g; k < chunks; k += kSumGroups) {
      a0 += p0[k * cols + c];
      if (p1) a1 += p1[k * cols + c];
    }
  }
  s0[g][tc] = a0;
  s1[g][tc] = a1;
  __syncthreads();
  if (g == 0 && c < cols) {
    float t0 = 0.f, t1 = 0.f;
#pragma unroll
    for (int q = 0; q < kSumGroups; ++q) {
      t0 += s0[q][tc];
      t1 += s1[q][tc];
    }
    out0[c] = from_float<T>(t0);
    if (p1) out1[c] = from_float<T>(t1);
  }
}

// Launches column_sums_kernel on s; chunks == 0 gives zeros. p1/out1 may be null.
template <typename T>
void launch_column_sums(const float* p0, T* out0, const float* p1, T* out1, int64_t chunks, int64_t cols,
                        cudaStream_t s) {
  if (cols <= 0) return;
  const unsigned tiles = static_cast<unsigned>((cols + kSumCols - 1) / kSumCols);
  launch<column_sums_kernel<T>>(tiles, kSumCols * kSumGroups, 0, s, p0, out0, p1, out1, chunks, cols);
}

}  // namespace
}  // namespace cuda
}  // namespace fls
