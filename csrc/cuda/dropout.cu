// Bias + activation + dropout (+ residual) and the raw Philox keep mask on CUDA.
// Forward and mask: one thread per Philox group of 4 stream elements (one generator call per 4
// elements), grid-stride over any size and any offset alignment. Backward: grid (column tiles, row
// chunks); each thread walks one column of one chunk, writes dx and its partial column sum, then a
// second kernel sums the chunks in order, so dbias is deterministic (as in layer_norm.cu). The mask is
// regenerated from (seed, offset), never stored.
#include "dropout.h"
#include "dtype.cuh"
#include "fls/philox.h"

namespace fls {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kColThreads = 256;
constexpr int kRowsPerChunk = 64;
constexpr int64_t kMaxChunkBlocks = 65535;

// The Philox groups covering stream elements offset .. offset+n-1: the first, and how many.
__device__ __forceinline__ uint64_t first_group(const DropoutParams& d) { return d.offset >> 2; }
__device__ __forceinline__ uint64_t num_groups(int64_t n, const DropoutParams& d) {
  return ((d.offset + static_cast<uint64_t>(n) + 3) >> 2) - (d.offset >> 2);
}

__global__ void mask_kernel(bool* __restrict__ keep, int64_t n, DropoutParams d) {
  const uint64_t g0 = first_group(d), groups = num_groups(n, d);
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < groups;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const uint32_t bits = dropout_keep4(g0 + i, d);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int64_t e = static_cast<int64_t>((g0 + i) * 4 + k - d.offset);
      if (e >= 0 && e < n) keep[e] = (bits >> k) & 1u;
    }
  }
}

// y[e] = residual[e] (if RESID) + act(x[e] + bias[e % cols]) * factor(e).
template <typename T, Act ACT, bool RESID>
__global__ void fwd_kernel(const T* __restrict__ x, const T* __restrict__ bias, const T* __restrict__ residual,
                           T* __restrict__ y, int64_t n, int64_t cols, DropoutParams d) {
  const uint64_t g0 = first_group(d), groups = num_groups(n, d);
  const bool on = d.threshold != 0;
  const float scale = on ? d.scale : 1.0f;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < groups;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const uint32_t bits = on ? dropout_keep4(g0 + i, d) : 0xFu;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int64_t e = static_cast<int64_t>((g0 + i) * 4 + k - d.offset);
      if (e < 0 || e >= n) continue;
      const float f = ((bits >> k) & 1u) ? scale : 0.0f;
      float h = act_fwd<ACT, float>(to_float(x[e]) + to_float(bias[e % cols])) * f;
      if (RESID) h = to_float(residual[e]) + h;
      y[e] = from_float<T>(h);
    }
  }
}

// partial[chunk, c] = sum over the chunk's rows of dx[r, c] (in fp32); dx written on the way.
template <typename T, Act ACT>
__global__ void bwd_partial_kernel(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ bias,
                                   T* __restrict__ dx, float* __restrict__ partial, int64_t rows, int64_t cols,
                                   int64_t chunks, DropoutParams d) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  const float b = ACT == Act::kIdentity ? 0.0f : to_float(bias[c]);
  for (int64_t chunk = blockIdx.y; chunk < chunks; chunk += gridDim.y) {
    const int64_t r0 = chunk * kRowsPerChunk;
    const int64_t r1 = r0 + kRowsPerChunk < rows ? r0 + kRowsPerChunk : rows;
    float s = 0.0f;
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t e = r * cols + c;
      // One Philox call per element here (a column's elements lie in different groups); the
      // coalesced column layout is what makes dbias cheap and deterministic.
      float g = to_float(dy[e]) * dropout_factor(static_cast<uint64_t>(e), d);
      if (ACT != Act::kIdentity) g *= act_grad<ACT, float>(to_float(x[e]) + b);
      dx[e] = from_float<T>(g);
      s += g;
    }
    partial[chunk * cols + c] = s;
  }
}

template <typename T>
__global__ void bwd_final_kernel(const float* __restrict__ partial, T* __restrict__ dbias, int64_t chunks,
                                 int64_t cols) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float s = 0.0f;
  for (int64_t k = 0; k < chunks; ++k) s += partial[k * cols + c];
  dbias[c] = from_float<T>(s);
}

int64_t num_chunks(int64_t rows) { return (rows + kRowsPerChunk - 1) / kRowsPerChunk; }

template <typename T, Act ACT, bool RESID>
void launch_fwd(const void* x, const void* bias, const void* residual, void* y, int64_t n, int64_t cols,
                const DropoutParams& d, cudaStream_t s) {
  const int64_t groups = n / 4 + 2;  // an unaligned offset can spread n elements over n/4 + 2 groups
  fwd_kernel<T, ACT, RESID><<<grid_1d(groups, kThreads), kThreads, 0, s>>>(
      static_cast<const T*>(x), static_cast<const T*>(bias), static_cast<const T*>(residual), static_cast<T*>(y),
      n, cols, d);
}

template <typename T, Act ACT>
void launch_bwd(const void* dy, const void* x, const void* bias, void* dx, void* dbias, float* ws, int64_t rows,
                int64_t cols, const DropoutParams& d, cudaStream_t s) {
  const int64_t chunks = num_chunks(rows);
  const unsigned col_tiles = static_cast<unsigned>((cols + kColThreads - 1) / kColThreads);
  if (rows > 0) {
    const unsigned gy = static_cast<unsigned>(chunks < kMaxChunkBlocks ? chunks : kMaxChunkBlocks);
    bwd_partial_kernel<T, ACT><<<dim3(col_tiles, gy), kColThreads, 0, s>>>(
        static_cast<const T*>(dy), static_cast<const T*>(x), static_cast<const T*>(bias), static_cast<T*>(dx), ws,
        rows, cols, chunks, d);
  }
  bwd_final_kernel<T><<<col_tiles, kColThreads, 0, s>>>(ws, static_cast<T*>(dbias), chunks, cols);
}

}  // namespace

int dropout_mask(bool* keep, int64_t n, const DropoutParams& d, void* stream) {
  if (n == 0) return 0;
  mask_kernel<<<grid_1d(n / 4 + 2, kThreads), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(keep, n, d);
  FLS_CUDA_RETURN_LAST_ERROR();
}

int bias_act_dropout_fwd(DType dt, const void* x, const void* bias, const void* residual, void* y, int64_t rows,
                         int64_t cols, Act act, const DropoutParams& d, void* stream) {
  const int64_t n = rows * cols;
  if (n == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  FLS_CUDA_DISPATCH(
      dt, if (residual != nullptr) {
        launch_fwd<scalar_t, Act::kIdentity, true>(x, bias, residual, y, n, cols, d, s);
      } else {
        switch (act) {
          case Act::kIdentity: launch_fwd<scalar_t, Act::kIdentity, false>(x, bias, nullptr, y, n, cols, d, s); break;
          case Act::kRelu: launch_fwd<scalar_t, Act::kRelu, false>(x, bias, nullptr, y, n, cols, d, s); break;
          case Act::kGelu: launch_fwd<scalar_t, Act::kGelu, false>(x, bias, nullptr, y, n, cols, d, s); break;
          case Act::kGeluTanh: launch_fwd<scalar_t, Act::kGeluTanh, false>(x, bias, nullptr, y, n, cols, d, s); break;
        }
      });
  FLS_CUDA_RETURN_LAST_ERROR();
}

int64_t bias_act_dropout_bwd_workspace(int64_t rows, int64_t cols) { return num_chunks(rows) * cols; }

int bias_act_dropout_bwd(DType dt, const void* dy, const void* x, const void* bias, void* dx, void* dbias,
                         float* workspace, int64_t rows, int64_t cols, Act act, const DropoutParams& d, void* stream) {
  if (cols == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  FLS_CUDA_DISPATCH(
      dt, switch (act) {
        case Act::kIdentity: launch_bwd<scalar_t, Act::kIdentity>(dy, x, bias, dx, dbias, workspace, rows, cols, d, s); break;
        case Act::kRelu: launch_bwd<scalar_t, Act::kRelu>(dy, x, bias, dx, dbias, workspace, rows, cols, d, s); break;
        case Act::kGelu: launch_bwd<scalar_t, Act::kGelu>(dy, x, bias, dx, dbias, workspace, rows, cols, d, s); break;
        case Act::kGeluTanh: launch_bwd<scalar_t, Act::kGeluTanh>(dy, x, bias, dx, dbias, workspace, rows, cols, d, s); break;
      });
  FLS_CUDA_RETURN_LAST_ERROR();
}

}  // namespace cuda
}  // namespace fls
