// Layer norm forward/backward. One block per row for the row-wise work; the weight/bias gradients
// are column sums done in two deterministic steps (fixed row chunks, then a fixed-order sum).
#include "dtype.cuh"
#include "layer_norm.h"

namespace fls {
namespace cuda {
namespace {

constexpr int kRowThreads = 256;
constexpr int kColThreads = 256;
constexpr int kRowsPerChunk = 64;

template <typename T>
__global__ void ln_fwd_kernel(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                              T* __restrict__ y, float* __restrict__ mean, float* __restrict__ rstd, int64_t cols,
                              float eps) {
  __shared__ float scratch[32];
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
  __shared__ float scratch[32];
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

// partial[chunk, c] = sums over the rows of one chunk; grid (column tiles, chunks).
template <typename T>
__global__ void ln_bwd_partial_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                      const float* __restrict__ mean, const float* __restrict__ rstd,
                                      float* __restrict__ pw, float* __restrict__ pb, int64_t rows, int64_t cols) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kRowsPerChunk;
  const int64_t r1 = r0 + kRowsPerChunk < rows ? r0 + kRowsPerChunk : rows;
  float sw = 0.f, sb = 0.f;
  for (int64_t r = r0; r < r1; ++r) {
    const float g = to_float(dy[r * cols + c]);
    sw += g * (to_float(x[r * cols + c]) - mean[r]) * rstd[r];
    sb += g;
  }
  pw[blockIdx.y * cols + c] = sw;
  pb[blockIdx.y * cols + c] = sb;
}

template <typename T>
__global__ void ln_bwd_final_kernel(const float* __restrict__ pw, const float* __restrict__ pb, T* __restrict__ dw,
                                    T* __restrict__ db, int64_t chunks, int64_t cols) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float sw = 0.f, sb = 0.f;
  for (int64_t k = 0; k < chunks; ++k) {
    sw += pw[k * cols + c];
    sb += pb[k * cols + c];
  }
  dw[c] = from_float<T>(sw);
  db[c] = from_float<T>(sb);
}

int64_t num_chunks(int64_t rows) { return (rows + kRowsPerChunk - 1) / kRowsPerChunk; }

}  // namespace

int layer_norm_fwd(DType dt, const void* x, const void* weight, const void* bias, void* y, float* mean, float* rstd,
                   int64_t rows, int64_t cols, double eps, void* stream) {
  if (rows == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  FLS_CUDA_DISPATCH(dt, ln_fwd_kernel<scalar_t><<<static_cast<unsigned>(rows), kRowThreads, 0, s>>>(
                            static_cast<const scalar_t*>(x), static_cast<const scalar_t*>(weight),
                            static_cast<const scalar_t*>(bias), static_cast<scalar_t*>(y), mean, rstd, cols,
                            static_cast<float>(eps)));
  FLS_CUDA_RETURN_LAST_ERROR();
}

int64_t layer_norm_bwd_workspace(int64_t rows, int64_t cols) { return 2 * num_chunks(rows) * cols; }

int layer_norm_bwd(DType dt, const void* dy, const void* x, const void* weight, const float* mean,
                   const float* rstd, void* dx, void* dweight, void* dbias, float* workspace, int64_t rows,
                   int64_t cols, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  const int64_t chunks = num_chunks(rows);
  const unsigned col_tiles = static_cast<unsigned>((cols + kColThreads - 1) / kColThreads);
  float* pw = workspace;
  float* pb = workspace + chunks * cols;
  FLS_CUDA_DISPATCH(
      dt, using T = scalar_t;
      if (rows > 0) {
        ln_bwd_dx_kernel<T><<<static_cast<unsigned>(rows), kRowThreads, 0, s>>>(
            static_cast<const T*>(dy), static_cast<const T*>(x), static_cast<const T*>(weight), mean, rstd,
            static_cast<T*>(dx), cols);
        ln_bwd_partial_kernel<T><<<dim3(col_tiles, static_cast<unsigned>(chunks)), kColThreads, 0, s>>>(
            static_cast<const T*>(dy), static_cast<const T*>(x), mean, rstd, pw, pb, rows, cols);
      } ln_bwd_final_kernel<T><<<col_tiles, kColThreads, 0, s>>>(pw, pb, static_cast<T*>(dweight),
                                                                  static_cast<T*>(dbias), chunks, cols));
  FLS_CUDA_RETURN_LAST_ERROR();
}

}  // namespace cuda
}  // namespace fls
