// Varlen attention on CUDA: one warp per query row (forward, dq) or key row (dk, dv) of one (sentence, head),
// fp32 accumulation, the dropout mask drawn per element from the stream of the padded problem (VarlenProblem).
//
// The kernels are deliberately plain: lanes take 32 keys (queries) at a time, each lane one dot product over the
// head dim, then the lanes' weights are broadcast (shfl) and every lane accumulates its dims d = lane + 32 t of
// the output row in registers. The forward is one pass with an online softmax (the row's max and sum updated per
// 32 keys); it writes the output and the log-sum-exp. The backward recomputes the probabilities from lse: kernel 1,
// per query, writes rowsum(P * dP) = dout . out to the workspace and dq; kernel 2, per key, reads it and writes
// dk, dv. Every output row has one writer: no atomics, deterministic.
//
// Which CUDA path serves packed training on a GPU: torch's flash varlen kernel, wherever it applies (attention
// modes auto and flash; fp16/bf16, head dims a multiple of 8 up to 256, sm_80 or newer: use_flash in
// modules/multihead_attention.py), with its masks drawn from torch's CUDA generator. The kernels here are the
// path where it does not (fp32, other head dims) and under --ls-attention explicit, where the padded run's
// dropout masks must be reproduced exactly: they draw each probability's keep bit from the padded problem's
// Philox element, which no fused library kernel can. Off the fast path they stay plain: each lane reads its own
// key row over the head dim (dot_shared), 2 bytes of each 32-byte sector a request (9-12% sector efficiency in
// the kernel profile, the rest of each sector served by L1 to the following requests); a tiled kernel through
// shared memory and tensor cores is what flash already is.
#include "../kernels/varlen_attention.h"

#include <type_traits>

#include "device_assert.cuh"
#include "dtype.cuh"
#include "fls/philox.h"
#include "launch.cuh"
#include "reduce.cuh"
#include "shared_memory.cuh"

namespace fls {
namespace cuda {
namespace {

constexpr int kWarps = 4;  // rows in flight per block
constexpr int kMaxGridY = 65535;

// Asserts what the host could not check without a sync: sentence b's offsets are non-decreasing within [0, N].
// A kernel of its own, so that the attention kernels make no call (the assert's call costs them spills).
__global__ void check_offsets_kernel(const VarlenProblem s) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= s.B) return;
  const int64_t q0 = s.cu_seqlens_q[b], q1 = s.cu_seqlens_q[b + 1];
  const int64_t k0 = s.cu_seqlens_k[b], k1 = s.cu_seqlens_k[b + 1];
  if (q0 < 0 || q1 < q0 || q1 > s.Nq || q1 - q0 > s.max_seqlen_q || k0 < 0 || k1 < k0 || k1 > s.Nk ||
      k1 - k0 > s.max_seqlen_k)
    __assert_fail("varlen_attention: cu_seqlens must be non-decreasing offsets within [0, N], lengths <= max_seqlen",
                  __FILE__, __LINE__, __func__);
}

// The rows of sentence b.
struct Rows {
  int64_t q0, Lq, k0, Lk;
};

// What every warp of a block (b, h) of the grid (B*H, y) works on.
struct Task {
  int warp, lane, D;  // D <= kVarlenMaxHeadDim
  int64_t H, b, h;
  Rows r;  // sentence b's rows
  float scale;
};

__device__ __forceinline__ Task task_of(const VarlenProblem& s) {
  const int64_t b = blockIdx.x / s.H, q0 = s.cu_seqlens_q[b], k0 = s.cu_seqlens_k[b];
  return {static_cast<int>(threadIdx.x >> 5), static_cast<int>(threadIdx.x & 31), static_cast<int>(s.D), s.H, b,
          blockIdx.x % s.H, {q0, s.cu_seqlens_q[b + 1] - q0, k0, s.cu_seqlens_k[b + 1] - k0},
          static_cast<float>(s.scale)};
}

// x[d] of a row as float into shared memory (the warp's own slice), all lanes.
template <typename T>
__device__ __forceinline__ void load_row(const T* x, int D, float* dst, int lane) {
  __syncwarp();
  for (int d = lane; d < D; d += 32) dst[d] = to_float(x[d]);
  __syncwarp();
}

template <typename T>
__device__ __forceinline__ float dot_shared(const float* a, const T* x, int D) {
  float s = 0.f;
  for (int d = 0; d < D; ++d) s += a[d] * to_float(x[d]);
  return s;
}

// acc[t] += w * x[lane + 32 t] over the dims the lane owns.
template <typename T, int kVec>
__device__ __forceinline__ void axpy_lane(float (&acc)[kVec], float w, const T* x, int D, int lane) {
#pragma unroll
  for (int t = 0; t < kVec; ++t) {
    const int d = lane + 32 * t;
    if (d < D) acc[t] += w * to_float(x[d]);
  }
}

template <typename T, int kVec>
__device__ __forceinline__ void store_lane(const float (&acc)[kVec], float mul, T* y, int D, int lane) {
#pragma unroll
  for (int t = 0; t < kVec; ++t) {
    const int d = lane + 32 * t;
    if (d < D) y[d] = from_float<T>(acc[t] * mul);
  }
}

// grid (B*H, y): block (b, h) walks the sentence's rows kWarps at a time, a warp per row. smem: kWarps * D floats.
template <typename T, int kVec>
__global__ void __launch_bounds__(kWarps * 32) varlen_fwd_kernel(const T* __restrict__ q, const T* __restrict__ k,
                                                                 const T* __restrict__ v, T* __restrict__ out,
                                                                 float* __restrict__ lse, const VarlenProblem s) {
  FLS_DYNAMIC_SHARED(float, smem);
  const auto [warp, lane, D, H, b, h, r, scale] = task_of(s);
  float* qs = smem + warp * D;
  for (int64_t i = static_cast<int64_t>(blockIdx.y) * kWarps + warp; i < r.Lq; i += gridDim.y * kWarps) {
    const int64_t row = (r.q0 + i) * H + h;
    load_row(q + row * D, D, qs, lane);
    const int64_t n = varlen_key_end(s.causal, i, r.Lq, r.Lk);
    const uint64_t stream = varlen_row_stream(s, b, h, i);
    float m = -INFINITY, l = 0.f, acc[kVec];
#pragma unroll
    for (int t = 0; t < kVec; ++t) acc[t] = 0.f;
    for (int64_t j0 = 0; j0 < n; j0 += 32) {
      const int64_t j = j0 + lane;
      const float z = j < n ? scale * dot_shared(qs, k + ((r.k0 + j) * H + h) * D, D) : -INFINITY;
      const float m_new = fmaxf(m, group_max<32>(z));  // finite: key j0 exists
      const float e = j < n ? expf(z - m_new) : 0.f;
      const float corr = expf(m - m_new);  // 0 for the first chunk (m = -inf)
      l = l * corr + warp_sum(e);
      const float w = j < n ? e * dropout_factor(stream + static_cast<uint64_t>(j), s.drop) : 0.f;
#pragma unroll
      for (int t = 0; t < kVec; ++t) acc[t] *= corr;
      const int cnt = n - j0 < 32 ? static_cast<int>(n - j0) : 32;
#pragma unroll 1
      for (int jj = 0; jj < cnt; ++jj)
        axpy_lane(acc, __shfl_sync(0xffffffffu, w, jj), v + ((r.k0 + j0 + jj) * H + h) * D, D, lane);
      m = m_new;
    }
    store_lane(acc, n ? 1.f / l : 0.f, out + row * D, D, lane);
    if (lane == 0) lse[row] = n ? m + logf(l) : -INFINITY;
  }
}

// Backward 1: per query row, rowsum = dout . out (into ws) and dq = scale * sum_j dS_j k_j.
// smem: 2 * kWarps * D floats (q and dout rows).
template <typename T, int kVec>
__global__ void __launch_bounds__(kWarps * 32) varlen_bwd_dq_kernel(const T* __restrict__ dout,
                                                                    const T* __restrict__ q, const T* __restrict__ k,
                                                                    const T* __restrict__ v, const T* __restrict__ out,
                                                                    const float* __restrict__ lse,
                                                                    T* __restrict__ dq, float* __restrict__ ws,
                                                                    const VarlenProblem s) {
  FLS_DYNAMIC_SHARED(float, smem);
  const auto [warp, lane, D, H, b, h, r, scale] = task_of(s);
  float* qs = smem + warp * D;
  float* gs = smem + (kWarps + warp) * D;
  for (int64_t i = static_cast<int64_t>(blockIdx.y) * kWarps + warp; i < r.Lq; i += gridDim.y * kWarps) {
    const int64_t row = (r.q0 + i) * H + h;
    load_row(q + row * D, D, qs, lane);
    load_row(dout + row * D, D, gs, lane);
    float part = 0.f;
    for (int d = lane; d < D; d += 32) part += gs[d] * to_float(out[row * D + d]);
    const float rowsum = warp_sum(part);
    if (lane == 0) ws[row] = rowsum;
    const int64_t n = varlen_key_end(s.causal, i, r.Lq, r.Lk);
    const uint64_t stream = varlen_row_stream(s, b, h, i);
    const float lse_i = lse[row];
    float acc[kVec];
#pragma unroll
    for (int t = 0; t < kVec; ++t) acc[t] = 0.f;
    for (int64_t j0 = 0; j0 < n; j0 += 32) {
      const int64_t j = j0 + lane;
      float ds = 0.f;
      if (j < n) {
        const int64_t kr = ((r.k0 + j) * H + h) * D;
        const float pr = expf(scale * dot_shared(qs, k + kr, D) - lse_i);
        const float dp = dropout_factor(stream + static_cast<uint64_t>(j), s.drop) * dot_shared(gs, v + kr, D);
        ds = pr * (dp - rowsum);
      }
      const int cnt = n - j0 < 32 ? static_cast<int>(n - j0) : 32;
#pragma unroll 1
      for (int jj = 0; jj < cnt; ++jj)
        axpy_lane(acc, __shfl_sync(0xffffffffu, ds, jj), k + ((r.k0 + j0 + jj) * H + h) * D, D, lane);
    }
    store_lane(acc, scale, dq + row * D, D, lane);
  }
}

// Backward 2: per key row j, dk = scale * sum_i dS_ij q_i and dv = sum_i P_ij fac_ij dout_i over the queries that
// see it. smem: 2 * kWarps * D floats (k and v rows).
template <typename T, int kVec>
__global__ void __launch_bounds__(kWarps * 32) varlen_bwd_dkv_kernel(const T* __restrict__ dout,
                                                                     const T* __restrict__ q, const T* __restrict__ k,
                                                                     const T* __restrict__ v,
                                                                     const float* __restrict__ lse,
                                                                     const float* __restrict__ ws,
                                                                     T* __restrict__ dk, T* __restrict__ dv,
                                                                     const VarlenProblem s) {
  FLS_DYNAMIC_SHARED(float, smem);
  const auto [warp, lane, D, H, b, h, r, scale] = task_of(s);
  float* ks = smem + warp * D;
  float* vs = smem + (kWarps + warp) * D;
  for (int64_t j = static_cast<int64_t>(blockIdx.y) * kWarps + warp; j < r.Lk; j += gridDim.y * kWarps) {
    const int64_t krow = (r.k0 + j) * H + h;
    load_row(k + krow * D, D, ks, lane);
    load_row(v + krow * D, D, vs, lane);
    float dk_acc[kVec], dv_acc[kVec];
#pragma unroll
    for (int t = 0; t < kVec; ++t) dk_acc[t] = dv_acc[t] = 0.f;
    for (int64_t i0 = varlen_query_begin(s.causal, j, r.Lq, r.Lk); i0 < r.Lq; i0 += 32) {
      const int64_t i = i0 + lane;
      float ds = 0.f, pd = 0.f;
      if (i < r.Lq) {
        const int64_t row = (r.q0 + i) * H + h;
        const float pr = expf(scale * dot_shared(ks, q + row * D, D) - lse[row]);
        const float fac = dropout_factor(varlen_row_stream(s, b, h, i) + static_cast<uint64_t>(j), s.drop);
        ds = pr * (fac * dot_shared(vs, dout + row * D, D) - ws[row]);
        pd = pr * fac;
      }
      const int cnt = r.Lq - i0 < 32 ? static_cast<int>(r.Lq - i0) : 32;
#pragma unroll 1
      for (int ii = 0; ii < cnt; ++ii) {
        const int64_t row = (r.q0 + i0 + ii) * H + h;
        axpy_lane(dk_acc, __shfl_sync(0xffffffffu, ds, ii), q + row * D, D, lane);
        axpy_lane(dv_acc, __shfl_sync(0xffffffffu, pd, ii), dout + row * D, D, lane);
      }
    }
    store_lane(dk_acc, scale, dk + krow * D, D, lane);
    store_lane(dv_acc, 1.f, dv + krow * D, D, lane);
  }
}

inline dim3 grid_of(const VarlenProblem& s, int64_t max_rows) {
  const int64_t y = (max_rows + kWarps - 1) / kWarps;
  return dim3(static_cast<unsigned>(s.B * s.H), static_cast<unsigned>(y < 1 ? 1 : (y < kMaxGridY ? y : kMaxGridY)));
}

// Runs f.template operator()<kVec>() with kVec = ceil(D / 32) rounded up to 1, 2, 4 or 8 (D <= 256).
template <typename F>
inline cudaError_t dispatch_vec(int64_t D, F&& f) {
  if (D <= 32) return f(std::integral_constant<int, 1>{});
  if (D <= 64) return f(std::integral_constant<int, 2>{});
  if (D <= 128) return f(std::integral_constant<int, 4>{});
  if (D <= 256) return f(std::integral_constant<int, 8>{});
  return cudaErrorInvalidValue;
}

template <typename T>
cudaError_t fwd(const VarlenAttentionFwdParams& p, cudaStream_t st) {
  const VarlenProblem& s = p.s;
  if (s.B * s.H == 0 || s.Nq == 0) return cudaSuccess;
  launch<check_offsets_kernel>(grid_1d(s.B, 128), 128, 0, st, s);
  const size_t smem = kWarps * s.D * sizeof(float);
  return dispatch_vec(s.D, [&](auto vec) {
    launch<varlen_fwd_kernel<T, decltype(vec)::value>>(grid_of(s, s.max_seqlen_q), kWarps * 32, smem, st,
        static_cast<const T*>(p.q), static_cast<const T*>(p.k), static_cast<const T*>(p.v), static_cast<T*>(p.out),
        static_cast<float*>(p.lse), s);
    return cudaGetLastError();
  });
}

template <typename T>
cudaError_t bwd(const VarlenAttentionBwdParams& p, float* ws, cudaStream_t st) {
  const VarlenProblem& s = p.s;
  if (s.B * s.H == 0) return cudaSuccess;
  launch<check_offsets_kernel>(grid_1d(s.B, 128), 128, 0, st, s);
  const size_t smem = 2 * kWarps * s.D * sizeof(float);
  return dispatch_vec(s.D, [&](auto vec) {
    constexpr int V = decltype(vec)::value;
    const T* dout = static_cast<const T*>(p.dout);
    const T* q = static_cast<const T*>(p.q);
    const T* k = static_cast<const T*>(p.k);
    const T* v = static_cast<const T*>(p.v);
    const float* lse = static_cast<const float*>(p.lse);
    if (s.Nq > 0)
      launch<varlen_bwd_dq_kernel<T, V>>(grid_of(s, s.max_seqlen_q), kWarps * 32, smem, st,
          dout, q, k, v, static_cast<const T*>(p.out), lse, static_cast<T*>(p.dq), ws, s);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess || s.Nk == 0) return err;
    launch<varlen_bwd_dkv_kernel<T, V>>(grid_of(s, s.max_seqlen_k), kWarps * 32, smem, st,
        dout, q, k, v, lse, ws, static_cast<T*>(p.dk), static_cast<T*>(p.dv), s);
    return cudaGetLastError();
  });
}

}  // namespace

int varlen_attention_fwd(const VarlenAttentionFwdParams& p, void* stream) {
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  FLS_CUDA_DISPATCH(p.dtype, { const cudaError_t e = fwd<scalar_t>(p, st); if (e != cudaSuccess) return e; });
  FLS_CUDA_RETURN_LAST_ERROR();
}

int64_t varlen_attention_bwd_workspace(const VarlenProblem& s) { return s.Nq * s.H > 0 ? s.Nq * s.H : 1; }

int varlen_attention_bwd(const VarlenAttentionBwdParams& p, float* workspace, void* stream) {
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  FLS_CUDA_DISPATCH(p.dtype,
                    { const cudaError_t e = bwd<scalar_t>(p, workspace, st); if (e != cudaSuccess) return e; });
  FLS_CUDA_RETURN_LAST_ERROR();
}

}  // namespace cuda
}  // namespace fls
