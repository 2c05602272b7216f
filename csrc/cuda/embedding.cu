// Embedding forward (gather + scale + positions + dropout) and a deterministic backward: the wrapper sorts
// the lookup keys (stable), and one thread per (segment, column) sums its segment's rows in sorted order.
#include "dtype.cuh"
#include "embedding.h"
#include "fls/philox.h"

namespace fls {
namespace cuda {
namespace {

constexpr int kFwdThreads = 128;
constexpr int kSegThreads = 128;
constexpr unsigned kMaxGrid = 65535u * 16u;

// Each block handles rows (grid-stride); within a row, thread j handles the j-th 4-element Philox block
// of the row's stream range [s0, s0 + dim), so one Philox call serves 4 elements (blocks straddling two
// rows are computed by both rows, at most 2 extra calls per row).
template <typename T, bool kDrop, bool kPos>
__global__ void emb_fwd_kernel(const int64_t* __restrict__ tokens, const int64_t* __restrict__ positions,
                               const T* __restrict__ weight, const T* __restrict__ pos_weight, T* __restrict__ out,
                               int64_t n, int64_t dim, int64_t padding_idx, float scale, DropoutParams d) {
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    T* o = out + r * dim;
    const int64_t tok = tokens[r];
    if (tok == padding_idx) {
      for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) o[c] = from_float<T>(0.f);
      continue;
    }
    const T* w = weight + tok * dim;
    const T* p = kPos ? pos_weight + positions[r] * dim : nullptr;
    if (!kDrop) {
      for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) {
        float v = to_float(w[c]) * scale;
        if (kPos) v += to_float(p[c]);
        o[c] = from_float<T>(v);
      }
      continue;
    }
    const uint64_t s0 = d.offset + static_cast<uint64_t>(r) * static_cast<uint64_t>(dim);
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

// gd[e] = grad[e] * factor(e) over the flat [n * dim] range, thread per 4-element Philox block.
template <typename T>
__global__ void emb_bwd_dropout_kernel(const T* __restrict__ grad, float* __restrict__ gd, int64_t numel,
                                       DropoutParams d) {
  const uint64_t g0 = d.offset >> 2;
  const uint64_t ng = ((d.offset + static_cast<uint64_t>(numel) + 3) >> 2) - g0;
  for (uint64_t j = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < ng;
       j += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const uint32_t bits = dropout_keep4(g0 + j, d);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint64_t s = ((g0 + j) << 2) + k;
      if (s < d.offset || s >= d.offset + static_cast<uint64_t>(numel)) continue;
      const int64_t e = static_cast<int64_t>(s - d.offset);
      gd[e] = ((bits >> k) & 1u) ? to_float(grad[e]) * d.scale : 0.f;
    }
  }
}

// grid (segments, column tiles); a thread owns one column of one segment and sums its rows in order.
template <typename T, typename S>
__global__ void emb_bwd_segment_kernel(const S* __restrict__ src, const int64_t* __restrict__ sorted_rows,
                                       const int64_t* __restrict__ seg_offsets, const int64_t* __restrict__ seg_keys,
                                       int64_t num_segments, T* __restrict__ out, int64_t dim, float mult) {
  const int64_t c = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (c >= dim) return;
  for (int64_t s = blockIdx.x; s < num_segments; s += gridDim.x) {
    const int64_t key = seg_keys[s];
    if (key < 0) continue;
    float acc = 0.f;
    for (int64_t i = seg_offsets[s], e = seg_offsets[s + 1]; i < e; ++i) acc += to_float(src[sorted_rows[i] * dim + c]);
    out[key * dim + c] = from_float<T>(acc * mult);
  }
}

}  // namespace

int embedding_fwd(DType dt, const int64_t* tokens, const int64_t* positions, const void* weight,
                  const void* pos_weight, void* out, int64_t n, int64_t dim, int64_t padding_idx, double scale,
                  DropoutParams d, void* stream) {
  if (n == 0 || dim == 0) return 0;
  auto st = static_cast<cudaStream_t>(stream);
  const unsigned grid = static_cast<unsigned>(n < kMaxGrid ? n : kMaxGrid);
  const bool drop = d.threshold != 0, pos = pos_weight != nullptr;
  const float sc = static_cast<float>(scale);
#define FLS_EMB_FWD(DROP, POS)                                                                          \
  emb_fwd_kernel<scalar_t, DROP, POS><<<grid, kFwdThreads, 0, st>>>(                                   \
      tokens, positions, static_cast<const scalar_t*>(weight), static_cast<const scalar_t*>(pos_weight), \
      static_cast<scalar_t*>(out), n, dim, padding_idx, sc, d)
  FLS_CUDA_DISPATCH(dt, if (drop && pos) FLS_EMB_FWD(true, true); else if (drop) FLS_EMB_FWD(true, false);
                    else if (pos) FLS_EMB_FWD(false, true); else FLS_EMB_FWD(false, false));
#undef FLS_EMB_FWD
  FLS_CUDA_RETURN_LAST_ERROR();
}

int embedding_bwd_dropout(DType dt, const void* grad, float* gd, int64_t n, int64_t dim, DropoutParams d,
                          void* stream) {
  const int64_t numel = n * dim;
  if (numel == 0) return 0;
  auto st = static_cast<cudaStream_t>(stream);
  const int grid = grid_1d((numel + 3) / 4 + 1, 256);
  FLS_CUDA_DISPATCH(dt, emb_bwd_dropout_kernel<scalar_t><<<grid, 256, 0, st>>>(
                            static_cast<const scalar_t*>(grad), gd, numel, d));
  FLS_CUDA_RETURN_LAST_ERROR();
}

int embedding_bwd_segments(DType dt, const void* src, bool src_is_float, const int64_t* sorted_rows,
                           const int64_t* seg_offsets, const int64_t* seg_keys, int64_t num_segments, void* out,
                           int64_t dim, double mult, void* stream) {
  if (num_segments == 0 || dim == 0) return 0;
  auto st = static_cast<cudaStream_t>(stream);
  const unsigned tiles = static_cast<unsigned>((dim + kSegThreads - 1) / kSegThreads);
  if (tiles > 65535u) return static_cast<int>(cudaErrorInvalidValue);
  const dim3 grid(static_cast<unsigned>(num_segments < kMaxGrid ? num_segments : kMaxGrid), tiles);
  const float m = static_cast<float>(mult);
  FLS_CUDA_DISPATCH(
      dt, if (src_is_float) {
        emb_bwd_segment_kernel<scalar_t, float><<<grid, kSegThreads, 0, st>>>(
            static_cast<const float*>(src), sorted_rows, seg_offsets, seg_keys, num_segments,
            static_cast<scalar_t*>(out), dim, m);
      } else {
        emb_bwd_segment_kernel<scalar_t, scalar_t><<<grid, kSegThreads, 0, st>>>(
            static_cast<const scalar_t*>(src), sorted_rows, seg_offsets, seg_keys, num_segments,
            static_cast<scalar_t*>(out), dim, m);
      });
  FLS_CUDA_RETURN_LAST_ERROR();
}

}  // namespace cuda
}  // namespace fls
