// Attention probabilities (scale + key padding / causal masks + softmax + dropout) and the head
// split/merge around the attention GEMMs.
//
// Fast paths (16-byte vectors of V = 16 / sizeof(T) elements, 32-bit index math; chosen on the host when
// every pointer is 16-byte aligned and the sizes are multiples of V):
// - softmax (Tk <= 1024, Tk % V == 0): a group of G lanes per row holds the row in registers, so
//   forward reads the scores once and writes y (and the dropped copy) once; backward reads dout and y
//   once and writes dscores once. Dropout keep bits of a vector come from the Philox groups covering
//   its stream range (one extra group when the range does not start on a group boundary).
// - split/merge: a thread per 16-byte column vector of the token-major rows, walking rows; the
//   column -> (part, head, c) division is done once per thread, not per element.
// Fallbacks (any size, any alignment): the general kernels below them.
//
// General softmax: one block per row of Tk keys with loops over Tk (any length), fp32 math. Forward
// makes two passes over the row: an online max/sum, then the write of y (and of the dropped copy). The
// dropout mask comes from Philox groups of 4 stream elements (philox.h), one group per thread-step,
// so each Philox block is computed once; backward regenerates it instead of reading a stored mask.
#include <type_traits>

#include "attention.h"
#include "column_sums.cuh"
#include "dtype.cuh"
#include "fls/philox.h"

namespace fls {
namespace cuda {
namespace {

constexpr int kSplitThreads = 256;
constexpr int kColThreads = 256;
constexpr int kVecThreads = 128;       // threads of a vector-path block
constexpr int64_t kMinRowsPerChunk = 32;
constexpr int64_t kTargetChunks = 512;  // few chunks: the partial sums stay small (<= 512 rows of floats)
constexpr int kMaxVecSoftmaxTk = 1024;  // longest row the register-resident softmax holds

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

// Token-major [T, B, row_stride] -> head-major parts [B*H, T, hd] plus bias. Grid-stride over the
// token-major elements: reads coalesced, writes in runs of hd.
template <typename T>
__global__ void split_heads_kernel(const T* __restrict__ x, int64_t row_stride, const T* __restrict__ bias,
                                   Parts<T> out, int nparts, int64_t Tlen, int64_t B, int64_t H, int64_t hd) {
  const int64_t E = H * hd, width = nparts * E, total = Tlen * B * width;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = idx / width, c = idx - row * width;
    int64_t p, h, k;
    head_column(c, E, hd, p, h, k);
    out[p][head_major_index(row, h, k, Tlen, B, H, hd)] =
        from_float<T>(to_float(x[row * row_stride + c]) + to_float(bias[c]));
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
    int64_t p, h, k;
    head_column(c, E, hd, p, h, k);
    y[row * row_stride + c] = in[p][head_major_index(row, h, k, Tlen, B, H, hd)];
  }
}

// The fixed partition of rows into chunks for the column sums: depends on `rows` only; at most
// kTargetChunks chunks (so grid.y stays small).
int64_t rows_per_chunk(int64_t rows) {
  const int64_t r = (rows + kTargetChunks - 1) / kTargetChunks;
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
// 16-byte vector fast paths.

// Keep bits of the N (4 or 8) stream elements s .. s+N-1 as bits 0..N-1: one Philox group per 4
// elements, plus one more when s is not a multiple of 4 (the range then straddles N/4 + 1 groups).
template <int N>
__device__ __forceinline__ uint32_t keep_bits(uint64_t s, const DropoutParams& d) {
  const uint64_t g0 = s >> 2;
  const uint32_t a = static_cast<uint32_t>(s & 3);
  uint32_t bits = 0;
#pragma unroll
  for (int i = 0; i < N / 4; ++i) bits |= dropout_keep4(g0 + i, d) << (4 * i);
  if (a != 0) bits |= dropout_keep4(g0 + N / 4, d) << N;
  return bits >> a;
}

// Reductions over an aligned group of G lanes of a warp (every lane of the warp must call them).
template <int G>
__device__ __forceinline__ float group_max(float v) {
#pragma unroll
  for (int o = G / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
template <int G>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int o = G / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Pad bit of key j0 + q (q < N) from the N mask bytes loaded as one word (N = 4) or two (N = 8).
template <int N>
__device__ __forceinline__ void load_pad(const bool* p, bool (&pad)[N]) {
  if constexpr (N == 8) {
    const uint2 w = *reinterpret_cast<const uint2*>(p);
#pragma unroll
    for (int q = 0; q < 8; ++q) pad[q] = ((q < 4 ? w.x : w.y) >> (8 * (q & 3))) & 0xffu;
  } else {
    const uint32_t w = *reinterpret_cast<const uint32_t*>(p);
#pragma unroll
    for (int q = 0; q < N; ++q) pad[q] = (w >> (8 * q)) & 0xffu;
  }
}

// Register-resident softmax forward: G lanes per row (rows = B*H*Tq < 2^31), lane `l` holds the
// vectors l, l + G, ... (VPL of them) of the row; Tk % V == 0, Tk <= G * VPL * V. Same maths as
// softmax_fwd_kernel: masked keys and all-masked rows give exact zeros.
template <typename T, int G, int VPL>
__global__ void __launch_bounds__(kVecThreads, 1)
    softmax_fwd_vec_kernel(const T* __restrict__ scores, const bool* __restrict__ pad_mask, T* __restrict__ y,
                           T* __restrict__ out, uint32_t rows, uint32_t HTq, uint32_t Tq, uint32_t Tk, bool causal,
                           float scale, DropoutParams d) {
  constexpr int V = Pack<T>::kN;
  const uint32_t lane = threadIdx.x % G;
  const uint32_t row = blockIdx.x * (kVecThreads / G) + threadIdx.x / G;
  const bool active = row < rows;  // inactive lanes still join the shuffles
  const uint32_t b = active ? row / HTq : 0, i = active ? row % Tq : 0;
  int64_t lim = Tk;  // keys j >= lim are causally masked
  if (causal) {
    lim = static_cast<int64_t>(i) + (static_cast<int64_t>(Tk) - Tq) + 1;
    lim = lim < 0 ? 0 : (lim > Tk ? Tk : lim);
  }
  const uint64_t base = static_cast<uint64_t>(row) * Tk;
  float x[VPL][V];
  float m = -INFINITY;
#pragma unroll
  for (int n = 0; n < VPL; ++n) {
    const uint32_t j0 = (n * G + lane) * V;
    if (active && j0 < Tk) {
      float f[V];
      unpack<T>(*reinterpret_cast<const uint4*>(scores + base + j0), f);
      bool pad[V];
      if (pad_mask) {
        load_pad<V>(pad_mask + static_cast<uint64_t>(b) * Tk + j0, pad);
      } else {
#pragma unroll
        for (int q = 0; q < V; ++q) pad[q] = false;
      }
#pragma unroll
      for (int q = 0; q < V; ++q) {
        const bool valid = static_cast<int64_t>(j0 + q) < lim && !pad[q];
        x[n][q] = valid ? scale * f[q] : -INFINITY;
        m = fmaxf(m, x[n][q]);
      }
    } else {
#pragma unroll
      for (int q = 0; q < V; ++q) x[n][q] = -INFINITY;
    }
  }
  const float row_max = group_max<G>(m);
  float sum = 0.0f;
#pragma unroll
  for (int n = 0; n < VPL; ++n) {
#pragma unroll
    for (int q = 0; q < V; ++q) {
      // exp(-inf - row_max) = 0 for masked keys; an all-masked row (row_max = -inf) gets zeros.
      x[n][q] = row_max == -INFINITY ? 0.0f : expf(x[n][q] - row_max);
      sum += x[n][q];
    }
  }
  const float total = group_sum<G>(sum);
  const float inv = row_max == -INFINITY ? 0.0f : 1.0f / total;
#pragma unroll
  for (int n = 0; n < VPL; ++n) {
    const uint32_t j0 = (n * G + lane) * V;
    if (!active || j0 >= Tk) continue;
    float p[V];
#pragma unroll
    for (int q = 0; q < V; ++q) p[q] = x[n][q] * inv;
    *reinterpret_cast<uint4*>(y + base + j0) = pack<T>(p);
    if (out) {
      const uint32_t keep = keep_bits<V>(d.offset + base + j0, d);
#pragma unroll
      for (int q = 0; q < V; ++q) p[q] *= ((keep >> q) & 1u) ? d.scale : 0.0f;
      *reinterpret_cast<uint4*>(out + base + j0) = pack<T>(p);
    }
  }
}

// Register-resident softmax backward, same row layout: dscores = scale * y * (g - sum(g * y)),
// g = factor * dout (factors regenerated from the stream).
template <typename T, int G, int VPL>
__global__ void __launch_bounds__(kVecThreads, 1)
    softmax_bwd_vec_kernel(const T* __restrict__ dout, const T* __restrict__ y, T* __restrict__ ds, uint32_t rows,
                           uint32_t Tk, float scale, DropoutParams d) {
  constexpr int V = Pack<T>::kN;
  const uint32_t lane = threadIdx.x % G;
  const uint32_t row = blockIdx.x * (kVecThreads / G) + threadIdx.x / G;
  const bool active = row < rows;
  const uint64_t base = static_cast<uint64_t>(row) * Tk;
  uint4 dv[VPL], yv[VPL];
  uint32_t keep[VPL];
  float dot = 0.0f;
#pragma unroll
  for (int n = 0; n < VPL; ++n) {
    const uint32_t j0 = (n * G + lane) * V;
    keep[n] = 0xffffffffu;
    if (active && j0 < Tk) {
      dv[n] = *reinterpret_cast<const uint4*>(dout + base + j0);
      yv[n] = *reinterpret_cast<const uint4*>(y + base + j0);
      if (d.threshold != 0) keep[n] = keep_bits<V>(d.offset + base + j0, d);
      float fd[V], fy[V];
      unpack<T>(dv[n], fd);
      unpack<T>(yv[n], fy);
#pragma unroll
      for (int q = 0; q < V; ++q) {
        const float factor = d.threshold == 0 ? 1.0f : (((keep[n] >> q) & 1u) ? d.scale : 0.0f);
        dot += factor * fd[q] * fy[q];
      }
    }
  }
  dot = group_sum<G>(dot);
#pragma unroll
  for (int n = 0; n < VPL; ++n) {
    const uint32_t j0 = (n * G + lane) * V;
    if (!active || j0 >= Tk) continue;
    float fd[V], fy[V];
    unpack<T>(dv[n], fd);
    unpack<T>(yv[n], fy);
#pragma unroll
    for (int q = 0; q < V; ++q) {
      const float factor = d.threshold == 0 ? 1.0f : (((keep[n] >> q) & 1u) ? d.scale : 0.0f);
      fd[q] = scale * fy[q] * (factor * fd[q] - dot);
    }
    *reinterpret_cast<uint4*>(ds + base + j0) = pack<T>(fd);
  }
}

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

// split_heads_bwd, vector path: block (column tile, chunk); each thread copies its column vector over
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

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Calls launch(G, VPL) (std::integral_constant values) with the lane group G and vectors per lane
// VPL whose registers hold a row of nv vectors; false when the row is too long for that (fp32 rows
// of up to 256 vectors fit, 2-byte types up to 128).
template <int V, typename Launch>
bool by_row_vectors(int64_t nv, Launch&& launch) {
  using std::integral_constant;
  if (nv <= 8) {
    launch(integral_constant<int, 8>{}, integral_constant<int, 1>{});
  } else if (nv <= 16) {
    launch(integral_constant<int, 16>{}, integral_constant<int, 1>{});
  } else if (nv <= 32) {
    launch(integral_constant<int, 32>{}, integral_constant<int, 1>{});
  } else if (nv <= 64) {
    launch(integral_constant<int, 32>{}, integral_constant<int, 2>{});
  } else if (nv <= 128) {
    launch(integral_constant<int, 32>{}, integral_constant<int, 4>{});
  } else if constexpr (V == 4) {
    launch(integral_constant<int, 32>{}, integral_constant<int, 8>{});  // nv <= 256 since Tk <= 1024
  } else {
    return false;
  }
  return true;
}

// Blocks of kVecThreads threads for `rows` rows of G lanes each.
unsigned vec_row_blocks(int64_t rows, int G) {
  return static_cast<unsigned>((rows + kVecThreads / G - 1) / (kVecThreads / G));
}

// Launches the register-resident softmax forward when the row fits; false -> use the general kernel.
template <typename T>
bool softmax_fwd_vec(const T* scores, const bool* pad, T* y, T* out, int64_t B, int64_t H, int64_t Tq, int64_t Tk,
                     bool causal, float scale, const DropoutParams& d, cudaStream_t s) {
  constexpr int V = Pack<T>::kN;
  const int64_t rows = B * H * Tq;
  if (Tk % V != 0 || Tk > kMaxVecSoftmaxTk || rows > 2147483647LL) return false;
  if (!aligned16(scores) || !aligned16(y) || (out && !aligned16(out))) return false;
  if (pad && reinterpret_cast<uintptr_t>(pad) % 8 != 0) return false;
  const int64_t nv = Tk / V;  // vectors per row
  const uint32_t r = static_cast<uint32_t>(rows), htq = static_cast<uint32_t>(H * Tq),
                 tq = static_cast<uint32_t>(Tq), tk = static_cast<uint32_t>(Tk);
  return by_row_vectors<V>(nv, [&](auto g, auto vpl) {
    constexpr int G = decltype(g)::value;
    softmax_fwd_vec_kernel<T, G, decltype(vpl)::value><<<vec_row_blocks(rows, G), kVecThreads, 0, s>>>(
        scores, pad, y, out, r, htq, tq, tk, causal, scale, d);
  });
}

template <typename T>
bool softmax_bwd_vec(const T* dout, const T* y, T* ds, int64_t rows, int64_t Tk, float scale, const DropoutParams& d,
                     cudaStream_t s) {
  constexpr int V = Pack<T>::kN;
  if (Tk % V != 0 || Tk > kMaxVecSoftmaxTk || rows > 2147483647LL) return false;
  if (!aligned16(dout) || !aligned16(y) || !aligned16(ds)) return false;
  const int64_t nv = Tk / V;
  const uint32_t r = static_cast<uint32_t>(rows), tk = static_cast<uint32_t>(Tk);
  return by_row_vectors<V>(nv, [&](auto g, auto vpl) {
    constexpr int G = decltype(g)::value;
    softmax_bwd_vec_kernel<T, G, decltype(vpl)::value><<<vec_row_blocks(rows, G), kVecThreads, 0, s>>>(
        dout, y, ds, r, tk, scale, d);
  });
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

}  // namespace

int attention_softmax_fwd(DType dt, const void* scores, const bool* key_padding_mask, void* y, void* out, int64_t B,
                          int64_t H, int64_t Tq, int64_t Tk, bool causal, float scale, const DropoutParams& d,
                          void* stream) {
  const int64_t rows = B * H * Tq;
  if (rows == 0 || Tk == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  FLS_CUDA_DISPATCH(
      dt, using U = scalar_t; const U* sc = static_cast<const U*>(scores); U* yp = static_cast<U*>(y);
      U* op = d.threshold ? static_cast<U*>(out) : nullptr;
      if (!softmax_fwd_vec<U>(sc, key_padding_mask, yp, op, B, H, Tq, Tk, causal, scale, d, s)) {
        softmax_fwd_kernel<U><<<static_cast<unsigned>(rows), softmax_threads(Tk), 0, s>>>(
            sc, key_padding_mask, yp, op, H, Tq, Tk, causal, scale, d);
      });
  FLS_CUDA_RETURN_LAST_ERROR();
}

int attention_softmax_bwd(DType dt, const void* dout, const void* y, void* dscores, int64_t rows, int64_t Tk,
                          float scale, const DropoutParams& d, void* stream) {
  if (rows == 0 || Tk == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  FLS_CUDA_DISPATCH(
      dt, using U = scalar_t; const U* dp = static_cast<const U*>(dout); const U* yp = static_cast<const U*>(y);
      U* dsp = static_cast<U*>(dscores); if (!softmax_bwd_vec<U>(dp, yp, dsp, rows, Tk, scale, d, s)) {
        softmax_bwd_kernel<U><<<static_cast<unsigned>(rows), softmax_threads(Tk), 0, s>>>(dp, yp, dsp, Tk, scale, d);
      });
  FLS_CUDA_RETURN_LAST_ERROR();
}

int split_heads(DType dt, const void* x, int64_t row_stride, const void* bias, void* const* out, int nparts,
                int64_t T, int64_t B, int64_t H, int64_t hd, void* stream) {
  const int64_t total = T * B * nparts * H * hd;
  if (total == 0) return 0;
  if (nparts < 1 || nparts > 3) return cudaErrorInvalidValue;
  auto s = static_cast<cudaStream_t>(stream);
  bool aligned = aligned16(x) && aligned16(bias);
  for (int p = 0; p < nparts; ++p) aligned = aligned && aligned16(out[p]);
  FLS_CUDA_DISPATCH(
      dt, using U = scalar_t; SplitGeom g; if (aligned && split_geom<U>(T, B, H, hd, nparts, row_stride, g)) {
        Parts<uint4> parts{};
        for (int p = 0; p < nparts; ++p) parts.p[p] = static_cast<uint4*>(out[p]);
        dim3 grid, block;
        split_launch_shape(g, grid, block);
        split_heads_vec_kernel<U><<<grid, block, 0, s>>>(
            static_cast<const uint4*>(x), static_cast<uint32_t>(row_stride / Pack<U>::kN),
            static_cast<const uint4*>(bias), parts, g);
      } else {
        Parts<U> parts{};
        for (int p = 0; p < nparts; ++p) parts.p[p] = static_cast<U*>(out[p]);
        split_heads_kernel<U><<<grid_1d(total, kSplitThreads), kSplitThreads, 0, s>>>(
            static_cast<const U*>(x), row_stride, static_cast<const U*>(bias), parts, nparts, T, B, H, hd);
      });
  FLS_CUDA_RETURN_LAST_ERROR();
}

int merge_heads(DType dt, const void* const* in, int nparts, void* y, int64_t row_stride, int64_t T, int64_t B,
                int64_t H, int64_t hd, void* stream) {
  const int64_t total = T * B * nparts * H * hd;
  if (total == 0) return 0;
  if (nparts < 1 || nparts > 3) return cudaErrorInvalidValue;
  auto s = static_cast<cudaStream_t>(stream);
  bool aligned = aligned16(y);
  for (int p = 0; p < nparts; ++p) aligned = aligned && aligned16(in[p]);
  FLS_CUDA_DISPATCH(
      dt, using U = scalar_t; SplitGeom g; if (aligned && split_geom<U>(T, B, H, hd, nparts, row_stride, g)) {
        Parts<uint4> parts{};
        for (int p = 0; p < nparts; ++p) parts.p[p] = const_cast<uint4*>(static_cast<const uint4*>(in[p]));
        dim3 grid, block;
        split_launch_shape(g, grid, block);
        merge_heads_vec_kernel<<<grid, block, 0, s>>>(parts, static_cast<uint4*>(y),
                                                      static_cast<uint32_t>(row_stride / Pack<U>::kN), g);
      } else {
        Parts<U> parts{};
        for (int p = 0; p < nparts; ++p) parts.p[p] = const_cast<U*>(static_cast<const U*>(in[p]));
        merge_heads_kernel<U><<<grid_1d(total, kSplitThreads), kSplitThreads, 0, s>>>(
            parts, nparts, static_cast<U*>(y), row_stride, T, B, H, hd);
      });
  FLS_CUDA_RETURN_LAST_ERROR();
}

int64_t split_heads_bwd_workspace(int64_t rows, int64_t cols) { return num_chunks(rows) * cols; }

int split_heads_bwd(DType dt, const void* const* in, void* dqkv, void* dbias, float* workspace, int64_t T, int64_t B,
                    int64_t H, int64_t hd, void* stream) {
  const int64_t rows = T * B, cols = 3 * H * hd;
  if (cols == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  const int64_t chunks = num_chunks(rows), rpc = rows_per_chunk(rows);
  const bool aligned = aligned16(dqkv) && aligned16(in[0]) && aligned16(in[1]) && aligned16(in[2]);
  const unsigned col_tiles = static_cast<unsigned>((cols + kColThreads - 1) / kColThreads);
  FLS_CUDA_DISPATCH(
      dt, using U = scalar_t; SplitGeom g; if (rows > 0 && aligned && split_geom<U>(T, B, H, hd, 3, cols, g)) {
        Parts<uint4> parts{};
        for (int p = 0; p < 3; ++p) parts.p[p] = const_cast<uint4*>(static_cast<const uint4*>(in[p]));
        const unsigned vec_tiles = (g.width_v + kVecThreads - 1) / kVecThreads;
        split_bwd_vec_kernel<U><<<dim3(vec_tiles, static_cast<unsigned>(chunks)), kVecThreads, 0, s>>>(
            parts, static_cast<uint4*>(dqkv), workspace, g, static_cast<uint32_t>(rpc));
      } else if (rows > 0) {
        Parts<U> parts{};
        for (int p = 0; p < 3; ++p) parts.p[p] = const_cast<U*>(static_cast<const U*>(in[p]));
        split_bwd_kernel<U><<<dim3(col_tiles, static_cast<unsigned>(chunks)), kColThreads, 0, s>>>(
            parts, static_cast<U*>(dqkv), workspace, T, B, H, hd, rpc);
      } launch_column_sums<U>(workspace, static_cast<U*>(dbias), nullptr, nullptr, chunks, cols, s));
  FLS_CUDA_RETURN_LAST_ERROR();
}

}  // namespace cuda
}  // namespace fls
