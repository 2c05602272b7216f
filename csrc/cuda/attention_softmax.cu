// Attention probabilities on CUDA: scale + key padding / causal masks + softmax + dropout, and backward.
//
// Fast path (16-byte vectors of V = 16 / sizeof(T) elements, 32-bit index math; chosen on the host when
// every pointer is 16-byte aligned, Tk <= 1024 and Tk % V == 0): a group of G lanes per row holds the row
// in registers, so forward reads the scores once and writes y (and the dropped copy) once; backward reads
// dout and y once and writes dscores once. Dropout keep bits of a vector come from the Philox groups
// covering its stream range (one extra group when the range does not start on a group boundary), so a
// row may start anywhere in the stream: odd Tk, an offset, or a row start moved by AttentionCoords.
//
// General kernels (any Tk, any alignment): one block per row of Tk keys with loops over Tk, fp32 math.
// Forward makes two passes over the row: an online max/sum, then the write of y (and of the dropped
// copy). The dropout mask comes from Philox groups of 4 stream elements (philox.h), one group per
// thread-step, so each Philox block is computed once; backward regenerates it instead of reading a
// stored mask. attention_dropout (y -> the dropped copy again, for backward) has its own vector path: one
// 16-byte vector of a row a thread (Tk % V == 0, aligned pointers), else the general layout.
#include <type_traits>

#include "../kernels/attention.h"
#include "dtype.cuh"
#include "fls/philox.h"
#include "launch.cuh"
#include "reduce.cuh"
#include "shared_memory.cuh"
#include "vec.cuh"

namespace fls {
namespace cuda {
namespace {

constexpr int kVecThreads = 128;        // threads of a vector-path block
// The vector kernels give each row G <= 32 lanes of a warp and kVecThreads / G rows to a block, and their
// shuffles take whole warps: a partial warp would share a row with the next block.
static_assert(kVecThreads % 32 == 0, "attention_softmax.cu: kVecThreads must be a multiple of the warp size (32)");
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
                                   bool causal, float scale, DropoutParams d, AttentionCoords c) {
  FLS_SHARED(float, scratch, [32]);
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
    if (x == -INFINITY) continue;  // adds exp(-inf) = 0; the update below would add exp(-inf - -inf) = NaN
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
  for_each_key(d.offset + attention_row_stream(c, row), Tk, d, [&](int64_t j, float factor) {
    const bool valid = j < lim && !(pad && pad[j]) && row_max != -INFINITY;
    const float p = valid ? expf(scale * to_float(s[j]) - row_max) * inv : 0.0f;
    yr[j] = from_float<T>(p);
    if (outr) outr[j] = from_float<T>(p * factor);
  });
}

// dscores = scale * y * (g - sum(g * y)), g = factor * dout; the factors are regenerated.
template <typename T>
__global__ void softmax_bwd_kernel(const T* __restrict__ dout, const T* __restrict__ y, T* __restrict__ ds,
                                   int64_t Tk, float scale, DropoutParams d, AttentionCoords c) {
  FLS_SHARED(float, scratch, [32]);
  const int64_t row = blockIdx.x;
  const T* dr = dout + row * Tk;
  const T* yr = y + row * Tk;
  const uint64_t s0 = d.offset + attention_row_stream(c, row);
  float dot = 0.0f;
  for_each_key(s0, Tk, d, [&](int64_t j, float factor) { dot += factor * to_float(dr[j]) * to_float(yr[j]); });
  dot = block_sum(dot, scratch);
  T* dsr = ds + row * Tk;
  for_each_key(s0, Tk, d, [&](int64_t j, float factor) {
    const float yv = to_float(yr[j]);
    dsr[j] = from_float<T>(scale * yv * (factor * to_float(dr[j]) - dot));
  });
}

// ---------------------------------------------------------------------------------------------
// 16-byte vector fast path.

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

// out = factor * y: the dropped probabilities regenerated for backward (one block per row, any Tk). With
// kVec (Tk % V == 0, y and out 16-byte aligned) a thread takes V consecutive keys as one 16-byte vector,
// their keep bits from keep_bits (any row start in the stream); otherwise one Philox group a thread-step.
template <typename T, bool kVec>
__global__ void dropout_rows_kernel(const T* __restrict__ y, T* __restrict__ out, int64_t Tk, DropoutParams d,
                                    AttentionCoords c) {
  const int64_t row = blockIdx.x;
  const T* yr = y + row * Tk;
  T* outr = out + row * Tk;
  const uint64_t s0 = d.offset + attention_row_stream(c, row);
  if (kVec) {
    constexpr int V = Pack<T>::kN;
    const uint4* yv = reinterpret_cast<const uint4*>(yr);
    uint4* ov = reinterpret_cast<uint4*>(outr);
    for (int64_t v = threadIdx.x; v < Tk / V; v += blockDim.x) {
      const uint32_t bits = keep_bits<V>(s0 + static_cast<uint64_t>(v) * V, d);
      float f[V];
      unpack<T>(yv[v], f);
#pragma unroll
      for (int j = 0; j < V; ++j) f[j] *= ((bits >> j) & 1u) ? d.scale : 0.0f;
      ov[v] = pack<T>(f);
    }
    return;
  }
  for_each_key(s0, Tk, d, [&](int64_t j, float factor) { outr[j] = from_float<T>(factor * to_float(yr[j])); });
}

// Dropout multiplier of element q of a vector whose keep bits are `keep`: 1 when dropout is off.
__device__ __forceinline__ float keep_factor(uint32_t keep, int q, const DropoutParams& d) {
  return d.threshold == 0 ? 1.0f : (((keep >> q) & 1u) ? d.scale : 0.0f);
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
                           float scale, DropoutParams d, AttentionCoords c) {
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
      // The row's stream start (32-bit row split: rows < 2^31 on this path).
      const uint64_t s0 = d.offset + attention_row_stream(c, b, (row % HTq) / Tq, i);
      const uint32_t keep = keep_bits<V>(s0 + j0, d);
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
                           uint32_t Tk, float scale, DropoutParams d, AttentionCoords c) {
  constexpr int V = Pack<T>::kN;
  const uint32_t lane = threadIdx.x % G;
  const uint32_t row = blockIdx.x * (kVecThreads / G) + threadIdx.x / G;
  const bool active = row < rows;
  const uint64_t base = static_cast<uint64_t>(row) * Tk;
  uint64_t s0 = 0;  // the row's stream start (32-bit row split: rows < 2^31 on this path)
  if (d.threshold != 0) {
    const uint32_t tq = static_cast<uint32_t>(c.Tq), nh = static_cast<uint32_t>(c.H), bh = row / tq;
    s0 = d.offset + attention_row_stream(c, bh / nh, bh % nh, row % tq);
  }
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
      if (d.threshold != 0) keep[n] = keep_bits<V>(s0 + j0, d);
      float fd[V], fy[V];
      unpack<T>(dv[n], fd);
      unpack<T>(yv[n], fy);
#pragma unroll
      for (int q = 0; q < V; ++q) dot += keep_factor(keep[n], q, d) * fd[q] * fy[q];
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
    for (int q = 0; q < V; ++q) fd[q] = scale * fy[q] * (keep_factor(keep[n], q, d) * fd[q] - dot);
    *reinterpret_cast<uint4*>(ds + base + j0) = pack<T>(fd);
  }
}

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
                     bool causal, float scale, const DropoutParams& d, const AttentionCoords& c, cudaStream_t s) {
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
    launch<softmax_fwd_vec_kernel<T, G, decltype(vpl)::value>>(vec_row_blocks(rows, G), kVecThreads, 0, s,
        scores, pad, y, out, r, htq, tq, tk, causal, scale, d, c);
  });
}

template <typename T>
bool softmax_bwd_vec(const T* dout, const T* y, T* ds, int64_t rows, int64_t Tk, float scale, const DropoutParams& d,
                     const AttentionCoords& c, cudaStream_t s) {
  constexpr int V = Pack<T>::kN;
  if (Tk % V != 0 || Tk > kMaxVecSoftmaxTk || rows > 2147483647LL) return false;
  if (!aligned16(dout) || !aligned16(y) || !aligned16(ds)) return false;
  const int64_t nv = Tk / V;
  const uint32_t r = static_cast<uint32_t>(rows), tk = static_cast<uint32_t>(Tk);
  return by_row_vectors<V>(nv, [&](auto g, auto vpl) {
    constexpr int G = decltype(g)::value;
    launch<softmax_bwd_vec_kernel<T, G, decltype(vpl)::value>>(vec_row_blocks(rows, G), kVecThreads, 0, s,
        dout, y, ds, r, tk, scale, d, c);
  });
}

}  // namespace

int attention_softmax_fwd(const AttentionSoftmaxFwdParams& p, void* stream) {
  const int64_t B = p.B, H = p.H, Tq = p.Tq, Tk = p.Tk;
  const bool causal = p.causal;
  const bool* key_padding_mask = p.key_padding_mask;
  const float scale = static_cast<float>(p.scale);
  const DropoutParams& d = p.drop;
  const int64_t rows = B * H * Tq;
  if (rows == 0 || Tk == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  FLS_CUDA_DISPATCH(
      p.dtype, using U = scalar_t; const U* sc = static_cast<const U*>(p.scores); U* yp = static_cast<U*>(p.y);
      U* op = d.threshold ? static_cast<U*>(p.out) : nullptr;
      if (!softmax_fwd_vec<U>(sc, key_padding_mask, yp, op, B, H, Tq, Tk, causal, scale, d, p.coords, s)) {
        launch<softmax_fwd_kernel<U>>(static_cast<unsigned>(rows), softmax_threads(Tk), 0, s,
            sc, key_padding_mask, yp, op, H, Tq, Tk, causal, scale, d, p.coords);
      });
  FLS_CUDA_RETURN_LAST_ERROR();
}

int attention_softmax_bwd(const AttentionSoftmaxBwdParams& p, void* stream) {
  const int64_t rows = p.rows, Tk = p.Tk;
  const float scale = static_cast<float>(p.scale);
  const DropoutParams& d = p.drop;
  if (rows == 0 || Tk == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  FLS_CUDA_DISPATCH(
      p.dtype, using U = scalar_t; const U* dp = static_cast<const U*>(p.dout); const U* yp = static_cast<const U*>(p.y);
      U* dsp = static_cast<U*>(p.dscores); if (!softmax_bwd_vec<U>(dp, yp, dsp, rows, Tk, scale, d, p.coords, s)) {
        launch<softmax_bwd_kernel<U>>(static_cast<unsigned>(rows), softmax_threads(Tk), 0, s, dp, yp, dsp, Tk, scale, d,
                                                                                             p.coords);
      });
  FLS_CUDA_RETURN_LAST_ERROR();
}

int attention_dropout(const AttentionDropoutParams& p, void* stream) {
  if (p.rows == 0 || p.Tk == 0 || p.drop.threshold == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  const bool vec = aligned16(p.y) && aligned16(p.out);
  FLS_CUDA_DISPATCH(p.dtype, using U = scalar_t; const U* y = static_cast<const U*>(p.y); U* out = static_cast<U*>(p.out);
                    const unsigned grid = static_cast<unsigned>(p.rows); const int threads = softmax_threads(p.Tk);
                    if (vec && p.Tk % Pack<U>::kN == 0) {
                      launch<dropout_rows_kernel<U, true>>(grid, threads, 0, s, y, out, p.Tk, p.drop, p.coords);
                    } else {
                      launch<dropout_rows_kernel<U, false>>(grid, threads, 0, s, y, out, p.Tk, p.drop, p.coords);
                    });
  FLS_CUDA_RETURN_LAST_ERROR();
}

}  // namespace cuda
}  // namespace fls
