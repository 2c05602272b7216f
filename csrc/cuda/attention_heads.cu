// The head permutations around the attention GEMMs on CUDA: token-major qkv [T, B, 3E] plus bias -> head-major
// q, k, v [B*H, T, hd] (qkv_bias_split), its backward (the inverse permutation plus the bias gradient's
// deterministic column sums), and head-major -> token-major (merge_heads).
//
// Fast path (16-byte vectors of V = 16 / sizeof(T) elements, 32-bit index math; chosen on the host when
// every pointer is 16-byte aligned and hd and the row stride are multiples of V): a thread per 16-byte
// column vector of the token-major rows, walking rows; the column -> (part, head, c) division is done once
// per thread, not per element. General kernels (any size, any alignment): grid-stride over the elements.
#include "../kernels/attention.h"
#include "column_sums.cuh"
#include "dtype.cuh"
#include "launch.cuh"
#include "vec.cuh"

namespace fls {
namespace cuda {
namespace {

constexpr int kSplitThreads = 256;
constexpr int kColThreads = 256;
constexpr int kVecThreads = 128;        // threads of a vector-path block
// split_launch_shape rounds a block's width up to whole warps, at most kVecThreads: a partial warp would
// leave it wider than kVecThreads and the block with no rows (kVecThreads / tx == 0).
static_assert(kVecThreads % 32 == 0, "attention_heads.cu: kVecThreads must be a multiple of the warp size (32)");
constexpr int64_t kMinRowsPerChunk = 32;
constexpr int64_t kTargetChunks = 512;  // few chunks: the partial sums stay small (<= 512 rows of floats)

template <typename T>
struct Parts {
  T* p[3];
  // Selected with compares rather than a dynamic index, which would put the array in local memory.
  __device__ __forceinline__ T* operator[](int64_t i) const { return i == 0 ? p[0] : (i == 1 ? p[1] : p[2]); }
};

// Column c of a token row (nparts parts of E = H*hd columns) -> its part p, head h and position k.
__device__ __forceinline__ void head_column(int64_t c, int64_t E, int64_t hd, int64_t& p, int64_t& h, int64_t& k) {
  p = c / E;
  const int64_t rem = c - p * E;
  h = rem / hd;
  k = rem - h * hd;
}

// Index of (head h, position k) of token row `row` ([T, B] order) in a head-major [B*H, T, hd] part.
__device__ __forceinline__ int64_t head_major_index(int64_t row, int64_t h, int64_t k, int64_t Tlen, int64_t B,
                                                    int64_t H, int64_t hd) {
  const int64_t t = row / B, b = row - t * B;
  return ((b * H + h) * Tlen + t) * hd + k;
}

// Calls f(row, c, p, i) for every element (token row `row` of T*B, column c of nparts * H * hd) of the
// token-major side, grid-stride; p is the element's part and i its index in the head-major part p.
template <typename F>
__device__ __forceinline__ void for_each_token_element(int nparts, int64_t Tlen, int64_t B, int64_t H, int64_t hd,
                                                       F f) {
  const int64_t E = H * hd, width = nparts * E, total = Tlen * B * width;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = idx / width, c = idx - row * width;
    int64_t p, h, k;
    head_column(c, E, hd, p, h, k);
    f(row, c, p, head_major_index(row, h, k, Tlen, B, H, hd));
  }
}

// Token-major [T, B, row_stride] -> head-major parts [B*H, T, hd] plus bias. Grid-stride over the
// token-major elements: reads coalesced, writes in runs of hd.
template <typename T>
__global__ void split_heads_kernel(const T* __restrict__ x, int64_t row_stride, const T* __restrict__ bias,
                                   Parts<T> out, int nparts, int64_t Tlen, int64_t B, int64_t H, int64_t hd) {
  for_each_token_element(nparts, Tlen, B, H, hd, [&](int64_t row, int64_t c, int64_t p, int64_t i) {
    out[p][i] = from_float<T>(to_float(x[row * row_stride + c]) + to_float(bias[c]));
  });
}

// The inverse: grid-stride over the token-major output (coalesced writes).
template <typename T>
__global__ void merge_heads_kernel(Parts<T> in, int nparts, T* __restrict__ y, int64_t row_stride, int64_t Tlen,
                                   int64_t B, int64_t H, int64_t hd) {
  for_each_token_element(nparts, Tlen, B, H, hd,
                         [&](int64_t row, int64_t c, int64_t p, int64_t i) { y[row * row_stride + c] = in[p][i]; });
}

// The fixed partition of rows into chunks for the column sums: depends on `rows` only; at most
// kTargetChunks chunks (so grid.y stays small).
int64_t split_rows_per_chunk(int64_t rows) { return rows_per_chunk(rows, kTargetChunks, kMinRowsPerChunk); }
int64_t split_chunks(int64_t rows) { return chunk_count(rows, split_rows_per_chunk(rows)); }

// dqkv = merge of the three parts, and partial[chunk, c] = sum of dqkv[:, c] over the chunk's rows
// (in order). grid (column tiles, chunks).
template <typename T>
__global__ void split_bwd_kernel(Parts<T> in, T* __restrict__ dqkv, float* __restrict__ partial, int64_t Tlen,
                                 int64_t B, int64_t H, int64_t hd, int64_t rpc) {
  const int64_t E = H * hd, width = 3 * E, rows = Tlen * B;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= width) return;
  int64_t p, h, k;
  head_column(c, E, hd, p, h, k);
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rpc;
  const int64_t r1 = r0 + rpc < rows ? r0 + rpc : rows;
  float acc = 0.0f;
  for (int64_t row = r0; row < r1; ++row) {
    const T v = in[p][head_major_index(row, h, k, Tlen, B, H, hd)];
    dqkv[row * width + c] = v;
    acc += to_float(v);
  }
  partial[blockIdx.y * width + c] = acc;
}

// ---------------------------------------------------------------------------------------------
// 16-byte vector fast path.

// Vector-unit geometry of the token-major rows [rows = T*B, width] (width = nparts * H * hd) and of
// the head-major parts [B*H, T, hd]; every count is in 16-byte vectors and fits in 32 bits.
struct SplitGeom {
  uint32_t Tlen, B, H, hd_v, E_v, width_v, rows;
  // Vector offset in part `p` of column vector cv of token row (t, b); p/h/kv precomputed per thread.
  __device__ __forceinline__ uint32_t head_index(uint32_t h, uint32_t kv, uint32_t t, uint32_t b) const {
    return ((b * H + h) * Tlen + t) * hd_v + kv;
  }
};

// Column vector cv of a token row -> (part p, head h, vector kv within the head).
__device__ __forceinline__ void split_column(const SplitGeom& g, uint32_t cv, uint32_t& p, uint32_t& h,
                                             uint32_t& kv) {
  p = cv / g.E_v;
  const uint32_t rem = cv - p * g.E_v;
  h = rem / g.hd_v;
  kv = rem - h * g.hd_v;
}

// split_heads, vector path: thread (x) = a column vector, threads (y) and blocks (y) walk the rows.
template <typename T>
__global__ void split_heads_vec_kernel(const uint4* __restrict__ x, uint32_t stride_v, const uint4* __restrict__ bias,
                                       Parts<uint4> out, SplitGeom g) {
  const uint32_t cv = blockIdx.x * blockDim.x + threadIdx.x;
  if (cv >= g.width_v) return;
  uint32_t p, h, kv;
  split_column(g, cv, p, h, kv);
  uint4* o = out[p];
  constexpr int V = Pack<T>::kN;
  float bf[V];
  unpack<T>(bias[cv], bf);
  for (uint32_t r = blockIdx.y * blockDim.y + threadIdx.y; r < g.rows; r += gridDim.y * blockDim.y) {
    const uint32_t t = r / g.B, b = r - t * g.B;
    float f[V];
    unpack<T>(x[r * stride_v + cv], f);
#pragma unroll
    for (int q = 0; q < V; ++q) f[q] += bf[q];
    o[g.head_index(h, kv, t, b)] = pack<T>(f);
  }
}

// merge_heads, vector path (the inverse copy).
__global__ void merge_heads_vec_kernel(Parts<uint4> in, uint4* __restrict__ y, uint32_t stride_v, SplitGeom g) {
  const uint32_t cv = blockIdx.x * blockDim.x + threadIdx.x;
  if (cv >= g.width_v) return;
  uint32_t p, h, kv;
  split_column(g, cv, p, h, kv);
  const uint4* src = in[p];
  for (uint32_t r = blockIdx.y * blockDim.y + threadIdx.y; r < g.rows; r += gridDim.y * blockDim.y) {
    const uint32_t t = r / g.B, b = r - t * g.B;
    y[r * stride_v + cv] = src[g.head_index(h, kv, t, b)];
  }
}

// qkv_bias_split_bwd, vector path: block (column tile, chunk); each thread copies its column vector over
// the chunk's rows in order and keeps the V partial column sums in registers (same order as
// split_bwd_kernel, so both paths give the same bits).
template <typename T>
__global__ void split_bwd_vec_kernel(Parts<uint4> in, uint4* __restrict__ dqkv, float* __restrict__ partial,
                                     SplitGeom g, uint32_t rpc) {
  constexpr int V = Pack<T>::kN;
  const uint32_t cv = blockIdx.x * blockDim.x + threadIdx.x;
  if (cv >= g.width_v) return;
  uint32_t p, h, kv;
  split_column(g, cv, p, h, kv);
  const uint4* src = in[p];
  const uint32_t r0 = blockIdx.y * rpc;
  const uint32_t r1 = g.rows - r0 > rpc ? r0 + rpc : g.rows;  // r0 < rows: grid.y = number of chunks
  uint32_t t = r0 / g.B, b = r0 - t * g.B;
  float acc[V];
#pragma unroll
  for (int q = 0; q < V; ++q) acc[q] = 0.0f;
#pragma unroll 4  // several loads in flight per thread
  for (uint32_t r = r0; r < r1; ++r) {
    const uint4 v = src[g.head_index(h, kv, t, b)];
    dqkv[r * g.width_v + cv] = v;
    float f[V];
    unpack<T>(v, f);
#pragma unroll
    for (int q = 0; q < V; ++q) acc[q] += f[q];
    if (++b == g.B) {
      b = 0;
      ++t;
    }
  }
  float* pr = partial + static_cast<uint64_t>(blockIdx.y) * g.width_v * V + static_cast<uint64_t>(cv) * V;
#pragma unroll
  for (int q = 0; q < V; ++q) pr[q] = acc[q];
}

// Geometry of the vector path of split/merge, or false when it does not apply: hd and the token
// row stride multiples of V, and both index spaces (token-major, head-major) below 2^31 elements.
template <typename T>
bool split_geom(int64_t T_, int64_t B, int64_t H, int64_t hd, int nparts, int64_t row_stride, SplitGeom& g) {
  constexpr int V = Pack<T>::kN;
  if (hd % V != 0 || row_stride % V != 0) return false;
  const int64_t rows = T_ * B, width = nparts * H * hd;
  if (rows * (row_stride > width ? row_stride : width) > 2147483647LL || B * H * T_ * hd > 2147483647LL) return false;
  g.Tlen = static_cast<uint32_t>(T_);
  g.B = static_cast<uint32_t>(B);
  g.H = static_cast<uint32_t>(H);
  g.hd_v = static_cast<uint32_t>(hd / V);
  g.E_v = static_cast<uint32_t>(H * hd / V);
  g.width_v = static_cast<uint32_t>(width / V);
  g.rows = static_cast<uint32_t>(rows);
  return true;
}

// Block (x = column vectors, y = rows) and grid for the split/merge vector kernels.
void split_launch_shape(const SplitGeom& g, dim3& grid, dim3& block) {
  const uint32_t tx = g.width_v >= kVecThreads ? kVecThreads : (g.width_v + 31) / 32 * 32;
  const uint32_t ty = kVecThreads / tx;
  block = dim3(tx, ty);
  const uint32_t row_blocks = (g.rows + ty - 1) / ty;
  grid = dim3((g.width_v + tx - 1) / tx, row_blocks < 65535u ? row_blocks : 65535u);
}

// The generic launchers: nparts (1..3) parts of E = H*hd columns per token row.

// out[p][((b*H + h)*T + t)*hd + c] = x[(t*B + b)*row_stride + p*H*hd + h*hd + c] + bias[p*H*hd + h*hd + c].
int split_heads_add_bias(DType dt, const void* x, int64_t row_stride, const void* bias, void* const* out,
                         int nparts, int64_t T, int64_t B, int64_t H, int64_t hd, cudaStream_t s) {
  const int64_t total = T * B * nparts * H * hd;
  if (total == 0) return 0;
  if (nparts < 1 || nparts > 3) return cudaErrorInvalidValue;
  bool aligned = aligned16(x) && aligned16(bias);
  for (int p = 0; p < nparts; ++p) aligned = aligned && aligned16(out[p]);
  FLS_CUDA_DISPATCH(
      dt, using U = scalar_t; SplitGeom g; if (aligned && split_geom<U>(T, B, H, hd, nparts, row_stride, g)) {
        Parts<uint4> parts{};
        for (int p = 0; p < nparts; ++p) parts.p[p] = static_cast<uint4*>(out[p]);
        dim3 grid, block;
        split_launch_shape(g, grid, block);
        launch<split_heads_vec_kernel<U>>(grid, block, 0, s,
            static_cast<const uint4*>(x), static_cast<uint32_t>(row_stride / Pack<U>::kN),
            static_cast<const uint4*>(bias), parts, g);
      } else {
        Parts<U> parts{};
        for (int p = 0; p < nparts; ++p) parts.p[p] = static_cast<U*>(out[p]);
        launch<split_heads_kernel<U>>(grid_1d(total, kSplitThreads), kSplitThreads, 0, s,
            static_cast<const U*>(x), row_stride, static_cast<const U*>(bias), parts, nparts, T, B, H, hd);
      });
  FLS_CUDA_RETURN_LAST_ERROR();
}

// The inverse permutation (no bias): y[(t*B + b)*row_stride + p*E + h*hd + c] = in[p][((b*H + h)*T + t)*hd + c].
int merge_heads_of_parts(DType dt, const void* const* in, int nparts, void* y, int64_t row_stride, int64_t T,
                         int64_t B, int64_t H, int64_t hd, cudaStream_t s) {
  const int64_t total = T * B * nparts * H * hd;
  if (total == 0) return 0;
  if (nparts < 1 || nparts > 3) return cudaErrorInvalidValue;
  bool aligned = aligned16(y);
  for (int p = 0; p < nparts; ++p) aligned = aligned && aligned16(in[p]);
  FLS_CUDA_DISPATCH(
      dt, using U = scalar_t; SplitGeom g; if (aligned && split_geom<U>(T, B, H, hd, nparts, row_stride, g)) {
        Parts<uint4> parts{};
        for (int p = 0; p < nparts; ++p) parts.p[p] = const_cast<uint4*>(static_cast<const uint4*>(in[p]));
        dim3 grid, block;
        split_launch_shape(g, grid, block);
        launch<merge_heads_vec_kernel>(grid, block, 0, s, parts, static_cast<uint4*>(y),
                                                      static_cast<uint32_t>(row_stride / Pack<U>::kN), g);
      } else {
        Parts<U> parts{};
        for (int p = 0; p < nparts; ++p) parts.p[p] = const_cast<U*>(static_cast<const U*>(in[p]));
        launch<merge_heads_kernel<U>>(grid_1d(total, kSplitThreads), kSplitThreads, 0, s,
            parts, nparts, static_cast<U*>(y), row_stride, T, B, H, hd);
      });
  FLS_CUDA_RETURN_LAST_ERROR();
}

}  // namespace

int qkv_bias_split(const QkvBiasSplitParams& p, void* stream) {
  void* const out[3] = {p.q, p.k, p.v};
  return split_heads_add_bias(p.dtype, p.qkv, 3 * p.H * p.head_dim, p.bias, out, 3, p.T, p.B, p.H, p.head_dim,
                              static_cast<cudaStream_t>(stream));
}

int merge_heads(const MergeHeadsParams& p, void* stream) {
  const void* const in[1] = {p.x};
  return merge_heads_of_parts(p.dtype, in, 1, p.y, p.H * p.head_dim, p.T, p.B, p.H, p.head_dim,
                              static_cast<cudaStream_t>(stream));
}

int64_t qkv_bias_split_bwd_workspace(int64_t rows, int64_t cols) { return split_chunks(rows) * cols; }

int qkv_bias_split_bwd(const QkvBiasSplitBwdParams& p, float* workspace, void* stream) {
  const int64_t T = p.T, B = p.B, H = p.H, hd = p.head_dim;
  const void* const in[3] = {p.dq, p.dk, p.dv};
  void *dqkv = p.dqkv, *dbias = p.dbias;
  const int64_t rows = T * B, cols = 3 * H * hd;
  if (cols == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  const int64_t chunks = split_chunks(rows), rpc = split_rows_per_chunk(rows);
  const bool aligned = aligned16(dqkv) && aligned16(in[0]) && aligned16(in[1]) && aligned16(in[2]);
  const unsigned col_tiles = static_cast<unsigned>((cols + kColThreads - 1) / kColThreads);
  FLS_CUDA_DISPATCH(
      p.dtype, using U = scalar_t; SplitGeom g; if (rows > 0 && aligned && split_geom<U>(T, B, H, hd, 3, cols, g)) {
        Parts<uint4> parts{};
        for (int p = 0; p < 3; ++p) parts.p[p] = const_cast<uint4*>(static_cast<const uint4*>(in[p]));
        const unsigned vec_tiles = (g.width_v + kVecThreads - 1) / kVecThreads;
        launch<split_bwd_vec_kernel<U>>(dim3(vec_tiles, static_cast<unsigned>(chunks)), kVecThreads, 0, s,
            parts, static_cast<uint4*>(dqkv), workspace, g, static_cast<uint32_t>(rpc));
      } else if (rows > 0) {
        Parts<U> parts{};
        for (int p = 0; p < 3; ++p) parts.p[p] = const_cast<U*>(static_cast<const U*>(in[p]));
        launch<split_bwd_kernel<U>>(dim3(col_tiles, static_cast<unsigned>(chunks)), kColThreads, 0, s,
            parts, static_cast<U*>(dqkv), workspace, T, B, H, hd, rpc);
      } launch_column_sums<U>(workspace, static_cast<U*>(dbias), nullptr, nullptr, chunks, cols, s));
  FLS_CUDA_RETURN_LAST_ERROR();
}

}  // namespace cuda
}  // namespace fls
