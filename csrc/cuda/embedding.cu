// Embedding forward (gather + scale + positions + dropout) and a deterministic backward: the wrapper
// sorts the lookup keys (stable, on the device), and the first row of each run of equal keys sums the
// run's grad rows in sorted order (one thread per column group), applying the dropout mask on the fly. With a
// row map (row_map non-null, kernels/embedding.h) row r's mask is that of row row_map[r] (the kernels read
// the row's stream start from it; nothing else changes).
// Token/position ids are range-checked in the kernels (printf + device assert), not on the host: a host check
// needs a device->host copy, i.e. a stream sync per call.
#include <cstdio>

#include "../kernels/embedding.h"
#include "device_assert.cuh"
#include "dtype.cuh"
#include "fls/philox.h"
#include "launch.cuh"
#include "vec.cuh"

namespace fls {
namespace cuda {
namespace {

constexpr int kFwdThreads = 128;
constexpr int kBwdThreads = 128;
// The fast forward gives a row tpr threads, the least power of two that covers its packs or reaches
// kFwdThreads, and a block kFwdThreads / tpr rows: with any other kFwdThreads, tpr could exceed it (a block
// of no rows) or leave threads past the block's last row (on the next block's).
static_assert((kFwdThreads & (kFwdThreads - 1)) == 0, "embedding.cu: kFwdThreads must be a power of two");
constexpr unsigned kMaxGrid = 65535u * 16u;

// Prints the bad id and the limit once per warp that meets it, then fails a device assert (as PyTorch's
// embedding does: the kernel aborts and the next CUDA call of the process reports the error). Every
// thread that meets a bad id stops there, so none of them reads or writes out of bounds; the lanes wait for
// their printing lane (__syncwarp) so that no lane fails the launch before the line is printed. Not inlined
// and noreturn: the kernels then keep no registers live across this cold call (no spills).
[[noreturn]] __device__ __noinline__ void report_bad_id(int64_t id, int64_t limit, bool is_position) {
  const unsigned active = __activemask();
  if ((threadIdx.x & 31) == static_cast<unsigned>(__ffs(active) - 1)) {
    const char* what = is_position ? "position" : "token id";
    const char* limit_name = is_position ? "max positions" : "num_embeddings";
    if (id < 0) {
      printf("embedding: %s %lld is negative\n", what, static_cast<long long>(id));
    } else {
      printf("embedding: %s %lld exceeds %s %lld (valid: 0..%lld)\n", what, static_cast<long long>(id), limit_name,
             static_cast<long long>(limit), static_cast<long long>(limit - 1));
    }
  }
  __syncwarp(active);
  __assert_fail("embedding: id out of range (see the line above)", __FILE__, __LINE__, "report_bad_id");
}

__device__ __forceinline__ void check_id(int64_t id, int64_t limit, bool is_position) {
  if (id < 0 || id >= limit) report_bad_id(id, limit, is_position);
}

// The row of the padded draw whose stream elements row r uses: row_map[r], or r without a map.
__device__ __forceinline__ int64_t stream_row(const int64_t* row_map, int64_t r) {
  return row_map == nullptr ? r : row_map[r];
}


// Fast forward (dim % kN == 0, weight/pos_weight/out 16-byte aligned, and with dropout d.offset % 4 == 0):
// `tpr` threads (a power of two) per row, blockDim / tpr rows per block, 16-byte loads and stores. Pack v
// of row r holds stream elements s = d.offset + r * dim + v * kN ... + kN - 1; s is a multiple of 4, so the
// pack is exactly kN / 4 Philox groups starting at s / 4: one dropout_keep4 per 4 elements.
template <typename T, bool kDrop, bool kPos>
__global__ void __launch_bounds__(kFwdThreads)
    emb_fwd_vec_kernel(const int64_t* __restrict__ tokens, const int64_t* __restrict__ positions,
                       const T* __restrict__ weight, const T* __restrict__ pos_weight, T* __restrict__ out, int64_t n,
                       int dim, int64_t num_embeddings, int64_t num_positions, int64_t padding_idx, float scale,
                       DropoutParams d, const int64_t* __restrict__ row_map, int tpr) {
  constexpr int N = Pack<T>::kN;
  const int nvec = dim / N;
  const int sub = threadIdx.x / tpr, lane = threadIdx.x % tpr;
  const int rows_per_block = blockDim.x / tpr;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * rows_per_block + sub; r < n;
       r += static_cast<int64_t>(gridDim.x) * rows_per_block) {
    const int64_t tok = tokens[r];
    check_id(tok, num_embeddings, false);
    const int64_t pos = kPos ? positions[r] : 0;
    if (kPos) check_id(pos, num_positions, true);
    uint4* o = reinterpret_cast<uint4*>(out + r * dim);
    if (tok == padding_idx) {
      for (int v = lane; v < nvec; v += tpr) o[v] = make_uint4(0u, 0u, 0u, 0u);
      continue;
    }
    const uint4* wr = reinterpret_cast<const uint4*>(weight + tok * dim);
    const uint4* pr = reinterpret_cast<const uint4*>(kPos ? pos_weight + pos * dim : weight);
    const uint64_t row_group =
        (d.offset + static_cast<uint64_t>(stream_row(row_map, r)) * static_cast<uint64_t>(dim)) >> 2;
    for (int v = lane; v < nvec; v += tpr) {
      const uint4 wu = wr[v];
      float f[N];
#pragma unroll
      for (int j = 0; j < N; ++j) f[j] = unpack<T>(wu, j) * scale;
      if (kPos) {
        const uint4 pu = pr[v];
#pragma unroll
        for (int j = 0; j < N; ++j) f[j] += unpack<T>(pu, j);
      }
      if (kDrop) {
#pragma unroll
        for (int q = 0; q < N / 4; ++q) {
          const uint32_t bits = dropout_keep4(row_group + static_cast<uint64_t>(v) * (N / 4) + q, d);
#pragma unroll
          for (int k = 0; k < 4; ++k) f[4 * q + k] = ((bits >> k) & 1u) ? f[4 * q + k] * d.scale : 0.f;
        }
      }
      o[v] = pack<T>(f);
    }
  }
}

// General forward (any dim, offset, alignment): a block per row (grid-stride); within a row, thread j
// handles the j-th 4-element Philox group of the row's stream range [s0, s0 + dim), so one Philox call
// serves 4 elements (groups straddling two rows are computed by both rows, at most 2 extra calls per row).
template <typename T, bool kDrop, bool kPos>
__global__ void emb_fwd_kernel(const int64_t* __restrict__ tokens, const int64_t* __restrict__ positions,
                               const T* __restrict__ weight, const T* __restrict__ pos_weight, T* __restrict__ out,
                               int64_t n, int64_t dim, int64_t num_embeddings, int64_t num_positions,
                               int64_t padding_idx, float scale, DropoutParams d, const int64_t* __restrict__ row_map) {
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    T* o = out + r * dim;
    const int64_t tok = tokens[r];
    check_id(tok, num_embeddings, false);
    const int64_t pos = kPos ? positions[r] : 0;
    if (kPos) check_id(pos, num_positions, true);
    if (tok == padding_idx) {
      for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) o[c] = from_float<T>(0.f);
      continue;
    }
    const T* w = weight + tok * dim;
    const T* p = kPos ? pos_weight + pos * dim : nullptr;
    if (!kDrop) {
      for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) {
        float v = to_float(w[c]) * scale;
        if (kPos) v += to_float(p[c]);
        o[c] = from_float<T>(v);
      }
      continue;
    }
    const uint64_t s0 = d.offset + static_cast<uint64_t>(stream_row(row_map, r)) * static_cast<uint64_t>(dim);
    const uint64_t s1 = s0 + static_cast<uint64_t>(dim);
    const uint64_t g0 = s0 >> 2, ng = ((s1 + 3) >> 2) - g0;
    for (uint64_t j = threadIdx.x; j < ng; j += blockDim.x) {
      const uint32_t bits = dropout_keep4(g0 + j, d);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const uint64_t s = ((g0 + j) << 2) + k;
        if (s < s0 || s >= s1) continue;
        const int64_t c = static_cast<int64_t>(s - s0);
        float v = to_float(w[c]) * scale;
        if (kPos) v += to_float(p[c]);
        o[c] = from_float<T>(((bits >> k) & 1u) ? v * d.scale : 0.f);
      }
    }
  }
}

// Backward of one table. grid (sorted positions i, grid-stride; column tiles); a thread owns V consecutive
// columns c0 .. c0 + V - 1. Only the block at the first position of a run of equal keys works: it walks
// the run in sorted (= row) order. V == Pack<T>::kN is the vector case: dim % V == 0, grad and out 16-byte
// aligned and d.offset % 4 == 0, so a thread's columns of a row are one 16-byte load and V / 4 whole Philox
// groups; V == 1 is the general case (one call per element).
template <typename T, bool kDrop, int V>
__global__ void __launch_bounds__(kBwdThreads)
    emb_bwd_kernel(const T* __restrict__ grad, const int64_t* __restrict__ sorted_keys,
                   const int64_t* __restrict__ order, int64_t n, int64_t dim, int64_t num_rows, bool is_position,
                   float mult, DropoutParams d, const int64_t* __restrict__ row_map, T* __restrict__ out) {
  static_assert(V == 1 || V == Pack<T>::kN, "V: one element or one 16-byte vector");
  const int64_t c0 = (static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x) * V;
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const int64_t key = sorted_keys[i];
    if (key == kNoGradKey || (i > 0 && sorted_keys[i - 1] == key)) continue;
    check_id(key, num_rows, is_position);
    if (c0 >= dim) continue;
    int64_t end = i + 1;
    while (end < n && sorted_keys[end] == key) ++end;
    float acc[V];
#pragma unroll
    for (int k = 0; k < V; ++k) acc[k] = 0.f;
    // With dropout, rows one at a time: 4 rows in flight held 4 packs and their Philox states (52 registers on
    // sm_90, 56% occupancy); one row keeps it at 30 registers and full occupancy.
#pragma unroll(kDrop ? 1 : 4)
    for (int64_t j = i; j < end; ++j) {
      const int64_t row = order[j];
      const T* g = grad + row * dim + c0;  // (row, c0)
      float x[V];
      if constexpr (V > 1) {
        unpack<T>(*reinterpret_cast<const uint4*>(g), x);
      } else {
        x[0] = to_float(g[0]);
      }
      if (!kDrop) {
#pragma unroll
        for (int k = 0; k < V; ++k) acc[k] += x[k];
        continue;
      }
      const uint64_t e = static_cast<uint64_t>(stream_row(row_map, row) * dim + c0);  // stream element - d.offset
      if constexpr (V > 1) {
        uint32_t bits = 0;
#pragma unroll
        for (int q = 0; q < V / 4; ++q) bits |= dropout_keep4(((d.offset + e) >> 2) + q, d) << (4 * q);
#pragma unroll
        for (int k = 0; k < V; ++k) acc[k] += ((bits >> k) & 1u) ? x[k] * d.scale : 0.f;
      } else {
        acc[0] += dropout_keep(e, d) ? x[0] * d.scale : 0.f;
      }
    }
    T* o = out + key * dim + c0;
    if constexpr (V > 1) {
#pragma unroll
      for (int k = 0; k < V; ++k) acc[k] *= mult;
      *reinterpret_cast<uint4*>(o) = pack<T>(acc);
    } else {
      o[0] = from_float<T>(acc[0] * mult);
    }
  }
}

int pow2_at_least(int64_t v, int cap) {
  int p = 1;
  while (p < v && p < cap) p *= 2;
  return p;
}

template <typename T>
void launch_fwd(const int64_t* tokens, const int64_t* positions, const T* weight, const T* pos_weight, T* out,
                int64_t n, int64_t dim, int64_t num_embeddings, int64_t num_positions, int64_t padding_idx,
                float scale, DropoutParams d, const int64_t* row_map, cudaStream_t st) {
  constexpr int N = Pack<T>::kN;
  const bool drop = d.threshold != 0, pos = pos_weight != nullptr;
  const bool fast = dim % N == 0 && dim <= (int64_t{1} << 30) && aligned16(weight) &&
                    aligned16_or_null(pos_weight) && aligned16(out) && (!drop || d.offset % 4 == 0);
  if (fast) {
    const int tpr = pow2_at_least(dim / N, kFwdThreads);
    const int64_t rows_per_block = kFwdThreads / tpr;
    const int64_t blocks = (n + rows_per_block - 1) / rows_per_block;
    const unsigned grid = static_cast<unsigned>(blocks < kMaxGrid ? blocks : kMaxGrid);
    const int dm = static_cast<int>(dim);
#define FLS_EMB_FWD_VEC(DROP, POS)                                                                          \
  launch<emb_fwd_vec_kernel<T, DROP, POS>>(grid, kFwdThreads, 0, st, tokens, positions, weight, pos_weight, out, n, \
                                                                 dm, num_embeddings, num_positions,           \
                                                                 padding_idx, scale, d, row_map, tpr)
    if (drop && pos) FLS_EMB_FWD_VEC(true, true);
    else if (drop) FLS_EMB_FWD_VEC(true, false);
    else if (pos) FLS_EMB_FWD_VEC(false, true);
    else FLS_EMB_FWD_VEC(false, false);
#undef FLS_EMB_FWD_VEC
    return;
  }
  const unsigned grid = static_cast<unsigned>(n < kMaxGrid ? n : kMaxGrid);
#define FLS_EMB_FWD(DROP, POS)                                                                                 \
  launch<emb_fwd_kernel<T, DROP, POS>>(grid, kFwdThreads, 0, st, tokens, positions, weight, pos_weight, out, n, dim, \
                                                             num_embeddings, num_positions, padding_idx, scale, d, \
                                                             row_map)
  if (drop && pos) FLS_EMB_FWD(true, true);
  else if (drop) FLS_EMB_FWD(true, false);
  else if (pos) FLS_EMB_FWD(false, true);
  else FLS_EMB_FWD(false, false);
#undef FLS_EMB_FWD
}

template <typename T, int V>
int launch_bwd_v(const T* grad, const int64_t* sorted_keys, const int64_t* order, int64_t n, int64_t dim,
                 int64_t num_rows, bool is_position, float mult, DropoutParams d, const int64_t* row_map, T* out,
                 cudaStream_t st) {
  const int64_t tiles = (dim + int64_t{kBwdThreads} * V - 1) / (int64_t{kBwdThreads} * V);
  if (tiles > 65535) return static_cast<int>(cudaErrorInvalidValue);
  const dim3 grid(static_cast<unsigned>(n < kMaxGrid ? n : kMaxGrid), static_cast<unsigned>(tiles));
  if (d.threshold != 0) {
    launch<emb_bwd_kernel<T, true, V>>(grid, kBwdThreads, 0, st, grad, sorted_keys, order, n, dim, num_rows,
                                                              is_position, mult, d, row_map, out);
  } else {
    launch<emb_bwd_kernel<T, false, V>>(grid, kBwdThreads, 0, st, grad, sorted_keys, order, n, dim, num_rows,
                                                               is_position, mult, d, row_map, out);
  }
  return 0;
}

}  // namespace

int embedding_fwd(const EmbeddingFwdParams& p, void* stream) {
  if (p.n == 0 || p.dim == 0) return 0;
  FLS_CUDA_DISPATCH(p.dtype, launch_fwd<scalar_t>(p.tokens, p.positions, static_cast<const scalar_t*>(p.weight),
                                                  static_cast<const scalar_t*>(p.pos_weight),
                                                  static_cast<scalar_t*>(p.out), p.n, p.dim, p.num_embeddings,
                                                  p.num_positions, p.padding_idx, static_cast<float>(p.scale), p.drop,
                                                  p.row_map, static_cast<cudaStream_t>(stream)));
  FLS_CUDA_RETURN_LAST_ERROR();
}

int embedding_table_grad(const EmbeddingTableGradParams& p, const int64_t* sorted_keys, const int64_t* order,
                         void* stream) {
  const int64_t n = p.n, dim = p.dim, num_rows = p.num_rows;
  const DropoutParams& d = p.drop;
  const bool keys_are_positions = p.keys_are_positions;
  if (n == 0 || dim == 0) return 0;
  auto st = static_cast<cudaStream_t>(stream);
  const bool vec = (d.threshold == 0 || d.offset % 4 == 0) && aligned16(p.grad) && aligned16(p.out);
  const float m = static_cast<float>(p.mult);
  int err = 0;
  FLS_CUDA_DISPATCH(
      p.dtype, using T = scalar_t; const T* g = static_cast<const T*>(p.grad); T* o = static_cast<T*>(p.out);
      const int64_t* rm = p.row_map;
      constexpr int V = Pack<T>::kN;
      err = vec && dim % V == 0
                ? launch_bwd_v<T, V>(g, sorted_keys, order, n, dim, num_rows, keys_are_positions, m, d, rm, o, st)
               : launch_bwd_v<T, 1>(g, sorted_keys, order, n, dim, num_rows, keys_are_positions, m, d, rm, o, st));
  if (err != 0) return err;
  FLS_CUDA_RETURN_LAST_ERROR();
}

}  // namespace cuda
}  // namespace fls
