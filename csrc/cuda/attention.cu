// Attention probabilities (scale + key padding / causal masks + softmax + dropout) and the head
// split/merge around the attention GEMMs.
//
// Softmax: one block per row of Tk keys with loops over Tk (any length), fp32 math. Forward makes
// two passes over the row: an online max/sum, then the write of y (and of the dropped copy). The
// dropout mask comes from Philox groups of 4 stream elements (philox.h), one group per thread-step,
// so each Philox block is computed once; backward regenerates it instead of reading a stored mask.
#include "attention.h"
#include "dtype.cuh"
#include "fls/philox.h"

namespace fls {
namespace cuda {
namespace {

constexpr int kSplitThreads = 256;
constexpr int kColThreads = 256;
constexpr int64_t kMinRowsPerChunk = 32;
constexpr int64_t kMaxChunks = 65535;

int softmax_threads(int64_t Tk) { return Tk <= 1024 ? 128 : 256; }

// Calls f(j, factor) for every key j < n of a row whose first element is stream index s0, where
// factor is the dropout multiplier (1 when dropout is off). Threads of the block split the row.
template <typename F>
__device__ __forceinline__ void for_each_key(uint64_t s0, int64_t n, const DropoutParams& d, F f) {
  if (d.threshold == 0) {
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) f(j, 1.0f);
    return;
  }
  const uint64_t g_begin = s0 >> 2, g_end = (s0 + static_cast<uint64_t>(n) + 3) >> 2;
  for (uint64_t g = g_begin + threadIdx.x; g < g_end; g += blockDim.x) {
    const uint32_t keep = dropout_keep4(g, d);
#pragma unroll
    for (int lane = 0; lane < 4; ++lane) {
      const uint64_t e = 4 * g + lane;
      if (e < s0 || e >= s0 + static_cast<uint64_t>(n)) continue;
      f(static_cast<int64_t>(e - s0), ((keep >> lane) & 1u) ? d.scale : 0.0f);
    }
  }
}

template <typename T>
__global__ void softmax_fwd_kernel(const T* __restrict__ scores, const bool* __restrict__ pad_mask,
                                   T* __restrict__ y, T* __restrict__ out, int64_t H, int64_t Tq, int64_t Tk,
                                   bool causal, float scale, DropoutParams d) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const int64_t b = row / (H * Tq), i = row % Tq;
  int64_t lim = Tk;  // keys j >= lim are causally masked
  if (causal) {
    lim = i + (Tk - Tq) + 1;
    lim = lim < 0 ? 0 : (lim > Tk ? Tk : lim);
  }
  const T* s = scores + row * Tk;
  const bool* pad = pad_mask ? pad_mask + b * Tk : nullptr;
  // Pass 1: per-thread online max and sum of exp, then combined over the block.
  float m = -INFINITY, sum = 0.0f;
  for (int64_t j = threadIdx.x; j < lim; j += blockDim.x) {
    if (pad && pad[j]) continue;
    const float x = scale * to_float(s[j]);
    if (x > m) {
      sum = sum * expf(m - x) + 1.0f;
      m = x;
    } else {
      sum += expf(x - m);
    }
  }
  const float row_max = block_max(m, scratch);
  const float total = block_sum(m == -INFINITY ? 0.0f : sum * expf(m - row_max), scratch);
  // A row with every key masked has row_max == -inf: it gets zeros, never 0/0.
  const float inv = row_max == -INFINITY ? 0.0f : 1.0f / total;
  T* yr = y + row * Tk;
  T* outr = out ? out + row * Tk : nullptr;
  for_each_key(d.offset + static_cast<uint64_t>(row * Tk), Tk, d, [&](int64_t j, float factor) {
    const bool valid = j < lim && !(pad && pad[j]) && row_max != -INFINITY;
    const float p = valid ? expf(scale * to_float(s[j]) - row_max) * inv : 0.0f;
    yr[j] = from_float<T>(p);
    if (outr) outr[j] = from_float<T>(p * factor);
  });
}

// dscores = scale * y * (g - sum(g * y)), g = factor * dout; the factors are regenerated.
template <typename T>
__global__ void softmax_bwd_kernel(const T* __restrict__ dout, const T* __restrict__ y, T* __restrict__ ds,
                                   int64_t Tk, float scale, DropoutParams d) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const T* dr = dout + row * Tk;
  const T* yr = y + row * Tk;
  const uint64_t s0 = d.offset + static_cast<uint64_t>(row * Tk);
  float dot = 0.0f;
  for_each_key(s0, Tk, d, [&](int64_t j, float factor) { dot += factor * to_float(dr[j]) * to_float(yr[j]); });
  dot = block_sum(dot, scratch);
  T* dsr = ds + row * Tk;
  for_each_key(s0, Tk, d, [&](int64_t j, float factor) {
    const float yv = to_float(yr[j]);
    dsr[j] = from_float<T>(scale * yv * (factor * to_float(dr[j]) - dot));
  });
}

template <typename T>
struct Parts {
  T* p[3];
  // Selected with compares rather than a dynamic index, which would put the array in local memory.
  __device__ __forceinline__ T* operator[](int64_t i) const { return i == 0 ? p[0] : (i == 1 ? p[1] : p[2]); }
};

// Token-major [T, B, row_stride] -> head-major parts [B*H, T, hd] (+ bias). Grid-stride over the
// token-major elements: reads coalesced, writes in runs of hd.
template <typename T>
__global__ void split_heads_kernel(const T* __restrict__ x, int64_t row_stride, const T* __restrict__ bias,
                                   Parts<T> out, int nparts, int64_t Tlen, int64_t B, int64_t H, int64_t hd) {
  const int64_t E = H * hd, width = nparts * E, total = Tlen * B * width;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = idx / width, c = idx - row * width;
    const int64_t p = c / E, rem = c - p * E, h = rem / hd, k = rem - h * hd;
    const int64_t t = row / B, b = row - t * B;
    const T v = x[row * row_stride + c];
    out[p][((b * H + h) * Tlen + t) * hd + k] = bias ? from_float<T>(to_float(v) + to_float(bias[c])) : v;
  }
}

// The inverse: grid-stride over the token-major output (coalesced writes).
template <typename T>
__global__ void merge_heads_kernel(Parts<T> in, int nparts, T* __restrict__ y, int64_t row_stride, int64_t Tlen,
                                   int64_t B, int64_t H, int64_t hd) {
  const int64_t E = H * hd, width = nparts * E, total = Tlen * B * width;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = idx / width, c = idx - row * width;
    const int64_t p = c / E, rem = c - p * E, h = rem / hd, k = rem - h * hd;
    const int64_t t = row / B, b = row - t * B;
    y[row * row_stride + c] = in[p][((b * H + h) * Tlen + t) * hd + k];
  }
}

int64_t rows_per_chunk(int64_t rows) {
  const int64_t r = (rows + kMaxChunks - 1) / kMaxChunks;
  return r > kMinRowsPerChunk ? r : kMinRowsPerChunk;
}
int64_t num_chunks(int64_t rows) { return (rows + rows_per_chunk(rows) - 1) / rows_per_chunk(rows); }

// dqkv = merge of the three parts, and partial[chunk, c] = sum of dqkv[:, c] over the chunk's rows
// (in order). grid (column tiles, chunks).
template <typename T>
__global__ void split_bwd_kernel(Parts<T> in, T* __restrict__ dqkv, float* __restrict__ partial, int64_t Tlen,
                                 int64_t B, int64_t H, int64_t hd, int64_t rpc) {
  const int64_t E = H * hd, width = 3 * E, rows = Tlen * B;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= width) return;
  const int64_t p = c / E, rem = c - p * E, h = rem / hd, k = rem - h * hd;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rpc;
  const int64_t r1 = r0 + rpc < rows ? r0 + rpc : rows;
  float acc = 0.0f;
  for (int64_t row = r0; row < r1; ++row) {
    const int64_t t = row / B, b = row - t * B;
    const T v = in[p][((b * H + h) * Tlen + t) * hd + k];
    dqkv[row * width + c] = v;
    acc += to_float(v);
  }
  partial[blockIdx.y * width + c] = acc;
}

template <typename T>
__global__ void column_final_kernel(const float* __restrict__ partial, T* __restrict__ sums, int64_t chunks,
                                    int64_t cols) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float s = 0.0f;
  for (int64_t k = 0; k < chunks; ++k) s += partial[k * cols + c];
  sums[c] = from_float<T>(s);
}

}  // namespace

int attention_softmax_fwd(DType dt, const void* scores, const bool* key_padding_mask, void* y, void* out, int64_t B,
                          int64_t H, int64_t Tq, int64_t Tk, bool causal, float scale, const DropoutParams& d,
                          void* stream) {
  const int64_t rows = B * H * Tq;
  if (rows == 0 || Tk == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  FLS_CUDA_DISPATCH(dt, softmax_fwd_kernel<scalar_t><<<static_cast<unsigned>(rows), softmax_threads(Tk), 0, s>>>(
                            static_cast<const scalar_t*>(scores), key_padding_mask, static_cast<scalar_t*>(y),
                            d.threshold ? static_cast<scalar_t*>(out) : nullptr, H, Tq, Tk, causal, scale, d));
  FLS_CUDA_RETURN_LAST_ERROR();
}

int attention_softmax_bwd(DType dt, const void* dout, const void* y, void* dscores, int64_t rows, int64_t Tk,
                          float scale, const DropoutParams& d, void* stream) {
  if (rows == 0 || Tk == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  FLS_CUDA_DISPATCH(dt, softmax_bwd_kernel<scalar_t><<<static_cast<unsigned>(rows), softmax_threads(Tk), 0, s>>>(
                            static_cast<const scalar_t*>(dout), static_cast<const scalar_t*>(y),
                            static_cast<scalar_t*>(dscores), Tk, scale, d));
  FLS_CUDA_RETURN_LAST_ERROR();
}

int split_heads(DType dt, const void* x, int64_t row_stride, const void* bias, void* const* out, int nparts,
                int64_t T, int64_t B, int64_t H, int64_t hd, void* stream) {
  const int64_t total = T * B * nparts * H * hd;
  if (total == 0) return 0;
  if (nparts < 1 || nparts > 3) return cudaErrorInvalidValue;
  auto s = static_cast<cudaStream_t>(stream);
  FLS_CUDA_DISPATCH(dt, using U = scalar_t; Parts<U> parts{}; for (int p = 0; p < nparts; ++p) parts.p[p] =
                            static_cast<U*>(out[p]);
                    split_heads_kernel<U><<<grid_1d(total, kSplitThreads), kSplitThreads, 0, s>>>(
                        static_cast<const U*>(x), row_stride, static_cast<const U*>(bias), parts, nparts, T, B, H,
                        hd));
  FLS_CUDA_RETURN_LAST_ERROR();
}

int merge_heads(DType dt, const void* const* in, int nparts, void* y, int64_t row_stride, int64_t T, int64_t B,
                int64_t H, int64_t hd, void* stream) {
  const int64_t total = T * B * nparts * H * hd;
  if (total == 0) return 0;
  if (nparts < 1 || nparts > 3) return cudaErrorInvalidValue;
  auto s = static_cast<cudaStream_t>(stream);
  FLS_CUDA_DISPATCH(dt, using U = scalar_t; Parts<U> parts{}; for (int p = 0; p < nparts; ++p) parts.p[p] =
                            const_cast<U*>(static_cast<const U*>(in[p]));
                    merge_heads_kernel<U><<<grid_1d(total, kSplitThreads), kSplitThreads, 0, s>>>(
                        parts, nparts, static_cast<U*>(y), row_stride, T, B, H, hd));
  FLS_CUDA_RETURN_LAST_ERROR();
}

int64_t split_heads_bwd_workspace(int64_t rows, int64_t cols) { return num_chunks(rows) * cols; }

int split_heads_bwd(DType dt, const void* const* in, void* dqkv, void* dbias, float* workspace, int64_t T, int64_t B,
                    int64_t H, int64_t hd, void* stream) {
  const int64_t rows = T * B, cols = 3 * H * hd;
  if (cols == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  const int64_t chunks = num_chunks(rows);
  const unsigned col_tiles = static_cast<unsigned>((cols + kColThreads - 1) / kColThreads);
  FLS_CUDA_DISPATCH(
      dt, using U = scalar_t; Parts<U> parts{};
      for (int p = 0; p < 3; ++p) parts.p[p] = const_cast<U*>(static_cast<const U*>(in[p]));
      if (rows > 0) {
        split_bwd_kernel<U><<<dim3(col_tiles, static_cast<unsigned>(chunks)), kColThreads, 0, s>>>(
            parts, static_cast<U*>(dqkv), workspace, T, B, H, hd, rows_per_chunk(rows));
      } column_final_kernel<U><<<col_tiles, kColThreads, 0, s>>>(workspace, static_cast<U*>(dbias), chunks, cols));
  FLS_CUDA_RETURN_LAST_ERROR();
}

}  // namespace cuda
}  // namespace fls
