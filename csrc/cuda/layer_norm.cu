// Layer norm forward/backward.
// Fast path (cols % (16 / sizeof(T)) == 0, cols <= kMaxFastCols, every pointer 16-byte aligned): one warp
// per row with the row held in registers and 16-byte vector accesses, so the forward reads x once and
// writes y once; the backward reads dy and x once, writes dx, and accumulates the dweight/dbias partial
// sums of its chunk of rows in the same kernel (no second pass over dy and x).
// General path (any other shape): one block per row, and a separate column-partial kernel.
// Both paths finish the weight/bias gradients with the same deterministic column sum: the rows are cut
// into chunks from the shape alone, each chunk is summed in a fixed order, then the chunks in order.
#include "../kernels/layer_norm.h"
#include "column_sums.cuh"
#include "dtype.cuh"
#include "launch.cuh"
#include "reduce.cuh"
#include "shared_memory.cuh"
#include "vec.cuh"

namespace fls {
namespace cuda {
namespace {

constexpr int kRowThreads = 256;  // general path: threads per row block
constexpr int kColThreads = 256;  // general path: column-partial kernel
constexpr int kRowsPerChunk = 64;  // general path: rows per column-partial chunk
constexpr int64_t kMaxGridY = 65535;
constexpr int kWarps = 4;          // fast path: warps (rows in flight) per block
constexpr int kMaxFastCols = 1024;  // fast path: row length bound (registers and shared memory)
constexpr int kMaxElemsPerLane = 32;  // fast path: register bound, elements of a row per lane
constexpr int64_t kTargetChunks = 1024;  // fast backward: about this many row chunks (blocks)
constexpr int64_t kMinRowsPerChunk = 2 * kWarps;

// ---------------------------------------------------------------------------------------------------
// Fast path. Lane `lane` of the warp owns the packs v = lane + 32 * k (k < NV) of the row, i.e. the
// elements [v * kN, v * kN + kN); packs with v >= cols / kN are absent (NV is cols rounded up).

// Stores the packs of a row that exist (v = lane + 32 * k < nvec): pack v holds the N values f(k, j),
// rounded once to T.
template <typename T, int NV, typename F>
__device__ __forceinline__ void store_row_packs(uint4* row, int lane, int nvec, F f) {
  constexpr int N = Pack<T>::kN;
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int v = lane + 32 * k;
    if (v < nvec) {
      float o[N];
#pragma unroll
      for (int j = 0; j < N; ++j) o[j] = f(k, j);
      row[v] = pack<T>(o);
    }
  }
}

template <typename T, int NV>
__global__ void __launch_bounds__(kWarps * 32) ln_fwd_warp_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                                                   const T* __restrict__ b, T* __restrict__ y,
                                                                   float* __restrict__ mean, float* __restrict__ rstd,
                                                                   int64_t rows, int cols, float eps) {
  constexpr int N = Pack<T>::kN;
  const int lane = threadIdx.x & 31;
  const int nvec = cols / N;
  const float inv_n = 1.f / static_cast<float>(cols);
  uint4 wv[NV], bv[NV];
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int v = lane + 32 * k;
    if (v < nvec) {
      wv[k] = reinterpret_cast<const uint4*>(w)[v];
      bv[k] = reinterpret_cast<const uint4*>(b)[v];
    }
  }
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5); row < rows;
       row += static_cast<int64_t>(gridDim.x) * kWarps) {
    const uint4* xr = reinterpret_cast<const uint4*>(x + row * cols);
    float xf[NV][N];
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int v = lane + 32 * k;
      const uint4 u = v < nvec ? xr[v] : make_uint4(0u, 0u, 0u, 0u);  // absent packs count as 0
#pragma unroll
      for (int j = 0; j < N; ++j) {
        xf[k][j] = unpack<T>(u, j);
        s += xf[k][j];
      }
    }
    const float mu = warp_sum(s) * inv_n;
    float sq = 0.f;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      if (lane + 32 * k < nvec) {
#pragma unroll
        for (int j = 0; j < N; ++j) {
          const float d = xf[k][j] - mu;
          sq += d * d;
        }
      }
    }
    const float rs = rsqrtf(warp_sum(sq) * inv_n + eps);
    store_row_packs<T, NV>(reinterpret_cast<uint4*>(y + row * cols), lane, nvec, [&](int k, int j) {
      return (xf[k][j] - mu) * rs * unpack<T>(wv[k], j) + unpack<T>(bv[k], j);
    });
    if (lane == 0) {
      mean[row] = mu;
      rstd[row] = rs;
    }
  }
}

// Where lane `v % 32` keeps its running sum of element j of pack v (NV packs a lane): element-major, so the 32
// lanes adding element j of their packs hit 32 banks, and the pack index XORed with j * (32 / N) (a
// permutation within each 32 packs), so the 32 threads summing 32 consecutive columns at the end do too.
template <typename T, int NV>
__device__ __forceinline__ int acc_index(int v, int j) {
  constexpr int N = Pack<T>::kN;
  return j * 32 * NV + (v ^ (j * (32 / N)));
}

// Block `chunk` handles rows [chunk * rows_per_chunk, +rows_per_chunk): warp w takes rows w, w + kWarps, ...
// of the chunk (fixed order), computes dx and accumulates dy * xhat and dy per column; the warps' sums are
// then added in warp order and written once as the chunk's partial row pw/pb[chunk, :].
// The column sums live in shared memory, not registers: beside the row's dy, x and w packs, 64 more
// accumulators a lane (NV = 4 of 8 halves) would need about 193 registers (ptxas, sm_90: 2 blocks of 4 warps
// an SM, 12.5% occupancy); in shared memory (32 KB a block) it takes 128, 4 blocks, 25%, no spills
// (scripts/kernel_profile). A lane's sums are its own until the barrier, so the adds need no synchronisation.
template <typename T, int NV>
__global__ void __launch_bounds__(kWarps * 32) ln_bwd_warp_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                                                const T* __restrict__ w,
                                                                const float* __restrict__ mean,
                                                                const float* __restrict__ rstd,
                                                                T* __restrict__ dx, float* __restrict__ pw,
                                                                float* __restrict__ pb, int64_t rows, int cols,
                                                                int64_t rows_per_chunk) {
  constexpr int N = Pack<T>::kN;
  FLS_SHARED(float, acc, [2][kWarps][kMaxFastCols]);  // [0]: dy * xhat, [1]: dy
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nvec = cols / N;
  const float inv_n = 1.f / static_cast<float>(cols);
  const int64_t chunk = blockIdx.x;
  const int64_t r0 = chunk * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
  float* aw = acc[0][warp];
  float* ab = acc[1][warp];
  uint4 wv[NV];
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int v = lane + 32 * k;
    wv[k] = v < nvec ? reinterpret_cast<const uint4*>(w)[v] : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
    for (int j = 0; j < N; ++j) aw[acc_index<T, NV>(v, j)] = ab[acc_index<T, NV>(v, j)] = 0.f;
  }
  for (int64_t row = r0 + warp; row < r1; row += kWarps) {
    const uint4* dyr = reinterpret_cast<const uint4*>(dy + row * cols);
    const uint4* xr = reinterpret_cast<const uint4*>(x + row * cols);
    const float mu = mean[row], rs = rstd[row];
    uint4 gv[NV], xv[NV];
    float sg = 0.f, sgx = 0.f;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int v = lane + 32 * k;
      // Absent packs read as 0: they add nothing to the sums and are never stored.
      gv[k] = v < nvec ? dyr[v] : make_uint4(0u, 0u, 0u, 0u);
      xv[k] = v < nvec ? xr[v] : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
      for (int j = 0; j < N; ++j) {
        const float d = unpack<T>(gv[k], j);
        const float xh = (unpack<T>(xv[k], j) - mu) * rs;
        const float g = d * unpack<T>(wv[k], j);
        sg += g;
        sgx += g * xh;
        aw[acc_index<T, NV>(v, j)] += d * xh;
        ab[acc_index<T, NV>(v, j)] += d;
      }
    }
    sg = warp_sum(sg) * inv_n;
    sgx = warp_sum(sgx) * inv_n;
    store_row_packs<T, NV>(reinterpret_cast<uint4*>(dx + row * cols), lane, nvec, [&](int k, int j) {
      const float g = unpack<T>(gv[k], j) * unpack<T>(wv[k], j);
      const float xh = (unpack<T>(xv[k], j) - mu) * rs;
      return rs * (g - sg - xh * sgx);
    });
  }
  __syncthreads();
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    const int i = acc_index<T, NV>(c / N, c % N);
    float sw = 0.f, sb = 0.f;
#pragma unroll
    for (int q = 0; q < kWarps; ++q) {
      sw += acc[0][q][i];
      sb += acc[1][q][i];
    }
    pw[chunk * cols + c] = sw;
    pb[chunk * cols + c] = sb;
  }
}

// ---------------------------------------------------------------------------------------------------
// General path (any cols, any alignment).

template <typename T>
__global__ void ln_fwd_kernel(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                              T* __restrict__ y, float* __restrict__ mean, float* __restrict__ rstd, int64_t cols,
                              float eps) {
  FLS_SHARED(float, scratch, [32]);
  const int64_t row = blockIdx.x;
  const T* xr = x + row * cols;
  T* yr = y + row * cols;
  float s = 0.f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) s += to_float(xr[c]);
  const float mu = block_sum(s, scratch) / static_cast<float>(cols);
  float sq = 0.f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float d = to_float(xr[c]) - mu;
    sq += d * d;
  }
  const float rs = rsqrtf(block_sum(sq, scratch) / static_cast<float>(cols) + eps);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    yr[c] = from_float<T>((to_float(xr[c]) - mu) * rs * to_float(w[c]) + to_float(b[c]));
  }
  if (threadIdx.x == 0) {
    mean[row] = mu;
    rstd[row] = rs;
  }
}

template <typename T>
__global__ void ln_bwd_dx_kernel(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ w,
                                 const float* __restrict__ mean, const float* __restrict__ rstd, T* __restrict__ dx,
                                 int64_t cols) {
  FLS_SHARED(float, scratch, [32]);
  const int64_t row = blockIdx.x;
  const T* dyr = dy + row * cols;
  const T* xr = x + row * cols;
  const float mu = mean[row], rs = rstd[row];
  float sg = 0.f, sgx = 0.f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float g = to_float(dyr[c]) * to_float(w[c]);
    sg += g;
    sgx += g * (to_float(xr[c]) - mu) * rs;
  }
  const float inv_n = 1.f / static_cast<float>(cols);
  sg = block_sum(sg, scratch) * inv_n;
  sgx = block_sum(sgx, scratch) * inv_n;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float g = to_float(dyr[c]) * to_float(w[c]);
    const float xh = (to_float(xr[c]) - mu) * rs;
    dx[row * cols + c] = from_float<T>(rs * (g - sg - xh * sgx));
  }
}

// partial[chunk, c] = sums over the rows of one chunk; grid (column tiles, min(chunks, 65535)), each block
// row looping over the chunks gridDim.y apart.
template <typename T>
__global__ void ln_bwd_partial_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                      const float* __restrict__ mean, const float* __restrict__ rstd,
                                      float* __restrict__ pw, float* __restrict__ pb, int64_t rows, int64_t cols,
                                      int64_t chunks) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  for (int64_t chunk = blockIdx.y; chunk < chunks; chunk += gridDim.y) {
    const int64_t r0 = chunk * kRowsPerChunk;
    const int64_t r1 = r0 + kRowsPerChunk < rows ? r0 + kRowsPerChunk : rows;
    float sw = 0.f, sb = 0.f;
    for (int64_t r = r0; r < r1; ++r) {
      const float g = to_float(dy[r * cols + c]);
      sw += g * (to_float(x[r * cols + c]) - mean[r]) * rstd[r];
      sb += g;
    }
    pw[chunk * cols + c] = sw;
    pb[chunk * cols + c] = sb;
  }
}

// ---------------------------------------------------------------------------------------------------

int64_t general_chunks(int64_t rows) { return chunk_count(rows, kRowsPerChunk); }

// Fast backward chunking: from the shape only (deterministic); at most kTargetChunks chunks.
int64_t fast_rows_per_chunk(int64_t rows) { return rows_per_chunk(rows, kTargetChunks, kMinRowsPerChunk); }
int64_t fast_chunks(int64_t rows) { return chunk_count(rows, fast_rows_per_chunk(rows)); }

// Packs per lane for the fast path: NV = smallest power of two with 32 * NV * kN >= cols; 0 = no fast path.
template <typename T>
int fast_nv(int64_t cols) {
  constexpr int N = Pack<T>::kN;
  if (cols > kMaxFastCols || cols % N != 0) return 0;
  int nv = 1;
  while (32 * nv * N < cols) nv *= 2;
  return nv * N <= kMaxElemsPerLane ? nv : 0;
}

// Calls f(std::integral_constant<int, NV>) for the runtime nv; instantiates only register-safe NVs.
template <typename T, typename F>
void with_nv(int nv, F&& f) {
  constexpr int N = Pack<T>::kN;
  switch (nv) {
    case 1: f(std::integral_constant<int, 1>()); break;
    case 2: f(std::integral_constant<int, 2>()); break;
    case 4:
      if constexpr (4 * N <= kMaxElemsPerLane) f(std::integral_constant<int, 4>());
      break;
    case 8:
      if constexpr (8 * N <= kMaxElemsPerLane) f(std::integral_constant<int, 8>());
      break;
    default: break;
  }
}

template <typename T>
void launch_fwd(const T* x, const T* w, const T* b, T* y, float* mean, float* rstd, int64_t rows, int64_t cols,
                float eps, cudaStream_t s) {
  const int nv = fast_nv<T>(cols);
  if (nv > 0 && aligned16(x) && aligned16(w) && aligned16(b) && aligned16(y)) {
    const int64_t blocks = (rows + kWarps - 1) / kWarps;
    const unsigned grid = static_cast<unsigned>(blocks < (1 << 20) ? blocks : (1 << 20));
    with_nv<T>(nv, [&](auto c) {
      launch<ln_fwd_warp_kernel<T, decltype(c)::value>>(grid, kWarps * 32, 0, s, x, w, b, y, mean, rstd, rows, static_cast<int>(cols), eps);
    });
    return;
  }
  launch<ln_fwd_kernel<T>>(static_cast<unsigned>(rows), kRowThreads, 0, s, x, w, b, y, mean, rstd, cols, eps);
}

template <typename T>
void launch_bwd(const T* dy, const T* x, const T* w, const float* mean, const float* rstd, T* dx, T* dw, T* db,
                float* workspace, int64_t rows, int64_t cols, cudaStream_t s) {
  const int nv = fast_nv<T>(cols);
  int64_t chunks = 0;
  float* pw = workspace;
  float* pb = nullptr;
  if (rows > 0 && nv > 0 && aligned16(dy) && aligned16(x) && aligned16(w) && aligned16(dx)) {
    chunks = fast_chunks(rows);
    pb = workspace + chunks * cols;
    const int64_t rpc = fast_rows_per_chunk(rows);
    with_nv<T>(nv, [&](auto c) {
      launch<ln_bwd_warp_kernel<T, decltype(c)::value>>(static_cast<unsigned>(chunks), kWarps * 32, 0, s,
          dy, x, w, mean, rstd, dx, pw, pb, rows, static_cast<int>(cols), rpc);
    });
  } else {
    chunks = rows > 0 ? general_chunks(rows) : 0;
    pb = workspace + chunks * cols;
    if (rows > 0) {
      const unsigned col_tiles = static_cast<unsigned>((cols + kColThreads - 1) / kColThreads);
      launch<ln_bwd_dx_kernel<T>>(static_cast<unsigned>(rows), kRowThreads, 0, s, dy, x, w, mean, rstd, dx, cols);
      const unsigned gy = static_cast<unsigned>(chunks < kMaxGridY ? chunks : kMaxGridY);
      launch<ln_bwd_partial_kernel<T>>(dim3(col_tiles, gy), kColThreads, 0, s, dy, x, mean, rstd, pw, pb, rows,
                                       cols, chunks);
    }
  }
  launch_column_sums<T>(pw, dw, pb, db, chunks, cols, s);
}

}  // namespace

int layer_norm_fwd(const LayerNormFwdParams& p, void* stream) {
  if (p.rows == 0) return 0;
  FLS_CUDA_DISPATCH(p.dtype, launch_fwd<scalar_t>(static_cast<const scalar_t*>(p.x),
                                                  static_cast<const scalar_t*>(p.weight),
                                                  static_cast<const scalar_t*>(p.bias), static_cast<scalar_t*>(p.y),
                                                  static_cast<float*>(p.mean), static_cast<float*>(p.rstd), p.rows,
                                                  p.cols, static_cast<float>(p.eps), static_cast<cudaStream_t>(stream)));
  FLS_CUDA_RETURN_LAST_ERROR();
}

// Enough for either path (the launcher picks the path from dtype and alignment, unknown here).
int64_t layer_norm_bwd_workspace(int64_t rows, int64_t cols) {
  const int64_t a = general_chunks(rows), b = fast_chunks(rows);
  return 2 * (a > b ? a : b) * cols;
}

int layer_norm_bwd(const LayerNormBwdParams& p, float* workspace, void* stream) {
  FLS_CUDA_DISPATCH(p.dtype, launch_bwd<scalar_t>(static_cast<const scalar_t*>(p.dy),
                                                  static_cast<const scalar_t*>(p.x),
                                                  static_cast<const scalar_t*>(p.weight),
                                                  static_cast<const float*>(p.mean), static_cast<const float*>(p.rstd),
                                                  static_cast<scalar_t*>(p.dx), static_cast<scalar_t*>(p.dweight),
                                                  static_cast<scalar_t*>(p.dbias), workspace, p.rows, p.cols,
                                                  static_cast<cudaStream_t>(stream)));
  FLS_CUDA_RETURN_LAST_ERROR();
}

}  // namespace cuda
}  // namespace fls
