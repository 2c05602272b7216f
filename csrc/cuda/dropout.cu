// Bias + activation + dropout (+ residual) and the raw Philox keep mask on CUDA.
//
// Fast paths (the usual case: stream offset % 4 == 0 or no dropout, row length a multiple of the
// 16-byte vector width V = 16 / sizeof(T), every pointer 16-byte aligned):
//  - forward: 2D grid, blockIdx.x/threadIdx.x pick one V-wide column vector (bias loaded once per
//    thread), blockIdx.y/threadIdx.y walk the rows. 16-byte loads/stores and one Philox call per 4
//    elements: with offset % 4 == 0 and cols % 4 == 0, 4 consecutive elements of a row are exactly
//    one Philox group. No per-element division or modulo.
//  - backward: each thread owns one column vector (V columns) and walks R rows of a block chunk of
//    by * R rows (a warp reads contiguous bytes of a row), writes dx and keeps V column partial sums in
//    registers; the block adds its by threads' sums per column in a fixed order (shared memory) and
//    writes one partial row per chunk. column_sums.cuh then adds the chunks in a fixed order, so dbias is
//    deterministic: the chunking depends on the shape only.
// General kernels (any offset alignment, any cols, unaligned pointers): forward and mask use one thread
// per Philox group of 4 stream elements, grid-stride over any size; backward walks one column of a
// 64-row chunk per thread (one Philox call per element). The mask is regenerated from (seed, offset),
// never stored.
// Row map (packed rows, kernels/dropout.h; the op layer passes one only with dropout on): forward and mask
// take one thread per Philox group of a row's own stream range (for_each_row_element); backward is the
// general kernel, each element's stream index taken from its row's.
#include "../kernels/dropout.h"
#include "column_sums.cuh"
#include "dtype.cuh"
#include "fls/philox.h"
#include "launch.cuh"
#include "shared_memory.cuh"
#include "vec.cuh"

namespace fls {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kColThreads = 256;
constexpr int kRowsPerChunk = 64;  // general backward: rows per chunk; also sizes the workspace
constexpr int64_t kMaxGridY = 65535;
// Fast kernels: a block is bx * by threads, bx a power of two up to kMaxVecCols and by = kThreads / bx.
// Fast backward: a block chunk is by * R rows, R raised where by is small so that a chunk is never
// smaller than kRowsPerChunk: the general workspace size then covers its partial rows.
constexpr int kMaxVecCols = 32;
static_assert(kThreads % kMaxVecCols == 0,
              "dropout.cu: kThreads must be a multiple of kMaxVecCols, or the fast kernels' blocks "
              "(bx * (kThreads / bx) threads) have fewer threads than their loops and shared sums assume");

// The Philox groups covering stream elements offset .. offset+n-1: the first, and how many.
__device__ __forceinline__ uint64_t first_group(const DropoutParams& d) { return d.offset >> 2; }
__device__ __forceinline__ uint64_t num_groups(int64_t n, const DropoutParams& d) {
  return ((d.offset + static_cast<uint64_t>(n) + 3) >> 2) - (d.offset >> 2);
}

// Keep bits of the N elements e .. e+N-1 (bit j = element e+j) when (d.offset + e) % 4 == 0 and
// N % 4 == 0: N/4 whole Philox groups. All ones when dropout is off (the RNG is skipped).
template <int N>
__device__ __forceinline__ uint32_t keep_bits_aligned(int64_t e, const DropoutParams& d) {
  if (d.threshold == 0) return (1u << N) - 1u;
  const uint64_t g = (d.offset >> 2) + (static_cast<uint64_t>(e) >> 2);
  uint32_t bits = 0;
#pragma unroll
  for (int q = 0; q < N / 4; ++q) bits |= dropout_keep4(g + q, d) << (4 * q);
  return bits;
}

__host__ __device__ inline int64_t groups_per_row(int64_t cols) { return (cols + 6) / 4; }

// The loop of the row-mapped kernels: visit(r, c, kept) for every element (r, c) of a [rows, cols] draw
// whose row r uses stream elements [s0, s0 + cols), s0 = d.offset + row_map[r] * cols. Grid-stride item i
// is Philox group j = i % gpr of row r = i / gpr's range (gpr = groups_per_row(cols), the most groups cols
// stream elements can touch): one Philox call serves up to 4 elements of a row whatever its alignment.
template <typename Visit>
__device__ __forceinline__ void for_each_row_element(int64_t rows, int64_t cols, const int64_t* __restrict__ row_map,
                                                     const DropoutParams& d, const Visit& visit) {
  const uint64_t gpr = static_cast<uint64_t>(groups_per_row(cols));
  const uint64_t items = static_cast<uint64_t>(rows) * gpr;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < items;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = static_cast<int64_t>(i / gpr);
    const uint64_t s0 = d.offset + static_cast<uint64_t>(row_map[r]) * static_cast<uint64_t>(cols);
    const uint64_t s1 = s0 + static_cast<uint64_t>(cols);
    const uint64_t g = (s0 >> 2) + (i - static_cast<uint64_t>(r) * gpr);
    if ((g << 2) >= s1) continue;
    const uint32_t bits = dropout_keep4(g, d);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint64_t s = (g << 2) + k;
      if (s >= s0 && s < s1) visit(r, static_cast<int64_t>(s - s0), (bits >> k) & 1u);
    }
  }
}

// --- mask ---
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

// offset % 4 == 0 and keep 4-byte aligned: group i covers keep[4i .. 4i+3], written as one 32-bit
// store (bools are bytes 0/1, little endian: byte k = bit k).
__global__ void mask_aligned_kernel(bool* __restrict__ keep, int64_t n, DropoutParams d) {
  const uint64_t g0 = d.offset >> 2, groups = (static_cast<uint64_t>(n) + 3) >> 2;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < groups;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const uint32_t bits = dropout_keep4(g0 + i, d);
    const int64_t e = static_cast<int64_t>(i * 4);
    if (e + 4 <= n) {
      const uint32_t bytes = (bits & 1u) | ((bits >> 1) & 1u) << 8 | ((bits >> 2) & 1u) << 16 | ((bits >> 3) & 1u) << 24;
      *reinterpret_cast<uint32_t*>(keep + e) = bytes;
    } else {
      for (int k = 0; e + k < n; ++k) keep[e + k] = (bits >> k) & 1u;
    }
  }
}

// Row-mapped mask: keep[r * cols + c] = keep bit of stream element d.offset + row_map[r] * cols + c.
struct MaskRows {
  bool* keep;
  int64_t cols;
  __device__ void operator()(int64_t r, int64_t c, uint32_t kept) const { keep[r * cols + c] = kept; }
};

__global__ void mask_rows_kernel(bool* __restrict__ keep, int64_t rows, int64_t cols,
                                 const int64_t* __restrict__ row_map, DropoutParams d) {
  for_each_row_element(rows, cols, row_map, d, MaskRows{keep, cols});
}

// --- forward ---
// y[e] = residual[e] (if RESID) + act(x[e] + bias[e % cols]) * factor(e). General layout.
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

// Row-mapped forward (dropout on): the arithmetic of fwd_kernel per element, the factor of element (r, c)
// from stream element d.offset + row_map[r] * cols + c.
template <typename T, Act ACT, bool RESID>
struct FwdRows {
  const T* x;
  const T* bias;
  const T* residual;
  T* y;
  int64_t cols;
  float scale;
  __device__ void operator()(int64_t r, int64_t c, uint32_t kept) const {
    const int64_t e = r * cols + c;
    float h = act_fwd<ACT, float>(to_float(x[e]) + to_float(bias[c])) * (kept ? scale : 0.0f);
    if (RESID) h = to_float(residual[e]) + h;
    y[e] = from_float<T>(h);
  }
};

template <typename T, Act ACT, bool RESID>
__global__ void fwd_rows_kernel(const T* __restrict__ x, const T* __restrict__ bias, const T* __restrict__ residual,
                                T* __restrict__ y, int64_t rows, int64_t cols, const int64_t* __restrict__ row_map,
                                DropoutParams d) {
  for_each_row_element(rows, cols, row_map, d, FwdRows<T, ACT, RESID>{x, bias, residual, y, cols, d.scale});
}

// Fast forward: thread (blockIdx.x * blockDim.x + threadIdx.x) owns column vector vc (columns
// vc*V .. vc*V+V-1) and rows blockIdx.y * blockDim.y + threadIdx.y, stepping by gridDim.y * blockDim.y.
// Same arithmetic per element as fwd_kernel, so the results are bitwise identical.
template <typename T, Act ACT, bool RESID>
__global__ void fwd_vec_kernel(const T* __restrict__ x, const T* __restrict__ bias, const T* __restrict__ residual,
                               T* __restrict__ y, int64_t rows, int64_t cols, int vec_cols, DropoutParams d) {
  constexpr int V = Pack<T>::kN;
  const int vc = blockIdx.x * blockDim.x + threadIdx.x;
  if (vc >= vec_cols) return;
  const float scale = d.threshold != 0 ? d.scale : 1.0f;
  const Pack<T> bv = *reinterpret_cast<const Pack<T>*>(bias + static_cast<int64_t>(vc) * V);
  float b[V];
#pragma unroll
  for (int j = 0; j < V; ++j) b[j] = to_float(bv.v[j]);
  const int64_t row_step = static_cast<int64_t>(gridDim.y) * blockDim.y;
  for (int64_t r = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y; r < rows; r += row_step) {
    const int64_t e = r * cols + static_cast<int64_t>(vc) * V;
    const Pack<T> xv = *reinterpret_cast<const Pack<T>*>(x + e);
    Pack<T> rv;
    if (RESID) rv = *reinterpret_cast<const Pack<T>*>(residual + e);
    const uint32_t bits = keep_bits_aligned<V>(e, d);
    Pack<T> yv;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float f = ((bits >> j) & 1u) ? scale : 0.0f;
      float h = act_fwd<ACT, float>(to_float(xv.v[j]) + b[j]) * f;
      if (RESID) h = to_float(rv.v[j]) + h;
      yv.v[j] = from_float<T>(h);
    }
    *reinterpret_cast<Pack<T>*>(y + e) = yv;
  }
}

// --- backward ---
// partial[chunk, c] = sum over the chunk's rows of dx[r, c] (in fp32); dx written on the way. General layout;
// with a row map (non-null) the mask of element (r, c) is stream element row_map[r] * cols + c's.
template <typename T, Act ACT>
__global__ void bwd_partial_kernel(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ bias,
                                   T* __restrict__ dx, float* __restrict__ partial, int64_t rows, int64_t cols,
                                   int64_t chunks, const int64_t* __restrict__ row_map, DropoutParams d) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  const float b = ACT == Act::kIdentity ? 0.0f : to_float(bias[c]);
  for (int64_t chunk = blockIdx.y; chunk < chunks; chunk += gridDim.y) {
    const int64_t r0 = chunk * kRowsPerChunk;
    const int64_t r1 = r0 + kRowsPerChunk < rows ? r0 + kRowsPerChunk : rows;
    float s = 0.0f;
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t e = r * cols + c;
      const int64_t se = row_map == nullptr ? e : row_map[r] * cols + c;  // its stream element (less d.offset)
      // One Philox call per element here (a column's elements lie in different groups).
      float g = to_float(dy[e]) * dropout_factor(static_cast<uint64_t>(se), d);
      if (ACT != Act::kIdentity) g *= act_grad<ACT, float>(to_float(x[e]) + b);
      dx[e] = from_float<T>(g);
      s += g;
    }
    partial[chunk * cols + c] = s;
  }
}

// Fast backward. Block (bx, by), bx * by == kThreads. Chunk k (blockIdx.y, grid-stride) holds rows
// k*by*R .. k*by*R + by*R - 1; thread (tx, ty) takes rows k*by*R + i*by + ty, i < R (so the block's
// warps read consecutive rows together), for column vector vc = blockIdx.x * bx + tx. The by partial
// sums of a column are then added in the order ty = 0 .. by-1: the chunk sum depends on the shape only.
template <Act ACT>
constexpr bool kGeluLike = ACT == Act::kGelu || ACT == Act::kGeluTanh;

template <typename T, Act ACT>
__global__ void __launch_bounds__(kThreads) bwd_vec_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                                           const T* __restrict__ bias, T* __restrict__ dx,
                                                           float* __restrict__ partial, int64_t rows, int64_t cols,
                                                           int vec_cols, int rows_per_thread, int64_t chunks,
                                                           DropoutParams d) {
  constexpr int V = Pack<T>::kN;
  FLS_SHARED(float, red, [kThreads * V]);  // [ty][tx * V + j]
  const int bx = blockDim.x, by = blockDim.y, tx = threadIdx.x, ty = threadIdx.y;
  const int vc = blockIdx.x * bx + tx;
  const bool active = vc < vec_cols;
  const float scale = d.threshold != 0 ? d.scale : 1.0f;
  float b[V];
#pragma unroll
  for (int j = 0; j < V; ++j) b[j] = 0.0f;
  if (ACT != Act::kIdentity && active) {
    const Pack<T> bv = *reinterpret_cast<const Pack<T>*>(bias + static_cast<int64_t>(vc) * V);
#pragma unroll
    for (int j = 0; j < V; ++j) b[j] = to_float(bv.v[j]);
  }
  const int64_t chunk_rows = static_cast<int64_t>(by) * rows_per_thread;
  for (int64_t chunk = blockIdx.y; chunk < chunks; chunk += gridDim.y) {
    float s[V];
#pragma unroll
    for (int j = 0; j < V; ++j) s[j] = 0.0f;
    if (active) {
      const int64_t r0 = chunk * chunk_rows + ty;  // this thread's first row
      // Rows r0 + i*by < rows for i < n_i. Only a chunk's tail divides, in 32 bits (left < chunk_rows
      // <= 4096 there): a 64-bit division is a subroutine call, whose saved registers spilled.
      const int64_t left = rows - r0;
      const int n_i = left <= 0 ? 0
                      : left >= chunk_rows ? rows_per_thread
                                           : (static_cast<int>(left) + by - 1) / by;
      // 4 rows in flight hide load latency; gelu's gradient needs the registers of 2 (4 spills).
#pragma unroll(kGeluLike<ACT> ? 2 : 4)
      for (int i = 0; i < n_i; ++i) {
        const int64_t e = (r0 + static_cast<int64_t>(i) * by) * cols + static_cast<int64_t>(vc) * V;
        const Pack<T> gv = *reinterpret_cast<const Pack<T>*>(dy + e);
        Pack<T> xv;
        if (ACT != Act::kIdentity) xv = *reinterpret_cast<const Pack<T>*>(x + e);
        const uint32_t bits = keep_bits_aligned<V>(e, d);
        Pack<T> ov;
#pragma unroll
        for (int j = 0; j < V; ++j) {
          // Same arithmetic as bwd_partial_kernel: dy * factor * act'(x + b).
          float g = to_float(gv.v[j]) * (((bits >> j) & 1u) ? scale : 0.0f);
          if (ACT != Act::kIdentity) g *= act_grad<ACT, float>(to_float(xv.v[j]) + b[j]);
          ov.v[j] = from_float<T>(g);
          s[j] += g;
        }
        *reinterpret_cast<Pack<T>*>(dx + e) = ov;
      }
    }
    // float4 stores (V is 4 or 8, so the thread's slot is 16-byte aligned): fewer bank conflicts.
    float4* slot = reinterpret_cast<float4*>(red + (ty * bx + tx) * V);
#pragma unroll
    for (int q = 0; q < V / 4; ++q) slot[q] = make_float4(s[4 * q], s[4 * q + 1], s[4 * q + 2], s[4 * q + 3]);
    __syncthreads();
    // Block column i (global column blockIdx.x*bx*V + i) = sum over ty of red[ty*bx*V + i], in order.
    const int width = bx * V;
    for (int i = ty * bx + tx; i < width; i += kThreads) {
      const int64_t c = static_cast<int64_t>(blockIdx.x) * width + i;
      if (c < cols) {
        float t = 0.0f;
        for (int k = 0; k < by; ++k) t += red[k * width + i];
        partial[chunk * cols + c] = t;
      }
    }
    __syncthreads();  // red is rewritten by the next chunk
  }
}

// --- launchers ---
// The fast (vector) kernels apply: 4 consecutive row elements form one Philox group, rows are whole
// vectors, and every pointer allows 16-byte accesses.
template <typename T>
bool use_vec_path(int64_t cols, const DropoutParams& d, const void* a, const void* b, const void* c,
                  const void* e) {
  constexpr int V = Pack<T>::kN;
  return (d.threshold == 0 || d.offset % 4 == 0) && cols % V == 0 && cols / V <= (int64_t{1} << 30) &&
         aligned16_or_null(a) && aligned16_or_null(b) && aligned16_or_null(c) && aligned16_or_null(e);
}

// Threads of a block along the column vectors: up to kMaxVecCols, a power of two (kThreads / bx rows).
int vec_block_x(int64_t vec_cols) {
  int bx = 1;
  while (bx < kMaxVecCols && bx < vec_cols) bx *= 2;
  return bx;
}

int64_t num_chunks(int64_t rows) { return chunk_count(rows, kRowsPerChunk); }

template <typename T, Act ACT, bool RESID>
void launch_fwd(const void* x, const void* bias, const void* residual, void* y, int64_t rows, int64_t cols,
                const DropoutParams& d, const int64_t* row_map, cudaStream_t s) {
  const int64_t n = rows * cols;
  if (row_map != nullptr) {
    launch<fwd_rows_kernel<T, ACT, RESID>>(grid_1d(rows * groups_per_row(cols), kThreads), kThreads, 0, s,
        static_cast<const T*>(x), static_cast<const T*>(bias), static_cast<const T*>(residual), static_cast<T*>(y),
        rows, cols, row_map, d);
    return;
  }
  if (use_vec_path<T>(cols, d, x, bias, residual, y)) {
    const int vec_cols = static_cast<int>(cols / Pack<T>::kN);
    const int bx = vec_block_x(vec_cols), by = kThreads / bx;
    const int64_t gy = (rows + by - 1) / by;
    const dim3 grid(static_cast<unsigned>((vec_cols + bx - 1) / bx), static_cast<unsigned>(gy < kMaxGridY ? gy : kMaxGridY));
    launch<fwd_vec_kernel<T, ACT, RESID>>(grid, dim3(bx, by), 0, s,
        static_cast<const T*>(x), static_cast<const T*>(bias), static_cast<const T*>(residual), static_cast<T*>(y),
        rows, cols, vec_cols, d);
    return;
  }
  const int64_t groups = n / 4 + 2;  // an unaligned offset can spread n elements over n/4 + 2 groups
  launch<fwd_kernel<T, ACT, RESID>>(grid_1d(groups, kThreads), kThreads, 0, s,
      static_cast<const T*>(x), static_cast<const T*>(bias), static_cast<const T*>(residual), static_cast<T*>(y),
      n, cols, d);
}

template <typename T, Act ACT>
void launch_bwd(const void* dy, const void* x, const void* bias, void* dx, void* dbias, float* ws, int64_t rows,
                int64_t cols, const DropoutParams& d, const int64_t* row_map, cudaStream_t s) {
  const bool ident = ACT == Act::kIdentity;
  int64_t chunks = 0;
  if (row_map == nullptr && use_vec_path<T>(cols, d, dy, ident ? nullptr : x, ident ? nullptr : bias, dx)) {
    const int vec_cols = static_cast<int>(cols / Pack<T>::kN);
    const int bx = vec_block_x(vec_cols), by = kThreads / bx;
    // Rows per thread from the shape only: 8 keeps enough blocks at ~4k rows, 16 halves the partial
    // buffer (rows / (16 * by) chunks) at large row counts. At least kRowsPerChunk / by: the workspace
    // holds num_chunks(rows) partial rows, so a chunk must not be smaller than kRowsPerChunk rows.
    const int min_rpt = (kRowsPerChunk + by - 1) / by;
    int rpt = rows >= 16384 ? 16 : 8;
    if (rpt < min_rpt) rpt = min_rpt;
    const int64_t chunk_rows = static_cast<int64_t>(by) * rpt;  // >= kRowsPerChunk: fits the workspace
    chunks = (rows + chunk_rows - 1) / chunk_rows;
    if (chunks > 0) {
      const dim3 grid(static_cast<unsigned>((vec_cols + bx - 1) / bx),
                      static_cast<unsigned>(chunks < kMaxGridY ? chunks : kMaxGridY));
      launch<bwd_vec_kernel<T, ACT>>(grid, dim3(bx, by), 0, s,
          static_cast<const T*>(dy), static_cast<const T*>(x), static_cast<const T*>(bias), static_cast<T*>(dx), ws,
          rows, cols, vec_cols, rpt, chunks, d);
    }
  } else {
    chunks = num_chunks(rows);
    const unsigned col_tiles = static_cast<unsigned>((cols + kColThreads - 1) / kColThreads);
    if (chunks > 0) {
      const unsigned gy = static_cast<unsigned>(chunks < kMaxGridY ? chunks : kMaxGridY);
      launch<bwd_partial_kernel<T, ACT>>(dim3(col_tiles, gy), kColThreads, 0, s,
          static_cast<const T*>(dy), static_cast<const T*>(x), static_cast<const T*>(bias), static_cast<T*>(dx), ws,
          rows, cols, chunks, row_map, d);
    }
  }
  launch_column_sums<T>(ws, static_cast<T*>(dbias), nullptr, nullptr, chunks, cols, s);
}

}  // namespace

int dropout_mask(const DropoutMaskParams& p, void* stream) {
  bool* keep = p.keep;
  const int64_t n = p.n;
  const DropoutParams& d = p.drop;
  if (n == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  if (p.row_map != nullptr) {
    const int64_t rows = n / p.cols;
    launch<mask_rows_kernel>(grid_1d(rows * groups_per_row(p.cols), kThreads), kThreads, 0, s, keep, rows, p.cols,
                                                                                            p.row_map, d);
  } else if (d.offset % 4 == 0 && reinterpret_cast<uintptr_t>(keep) % 4 == 0) {
    launch<mask_aligned_kernel>(grid_1d(n / 4 + 1, kThreads), kThreads, 0, s, keep, n, d);
  } else {
    launch<mask_kernel>(grid_1d(n / 4 + 2, kThreads), kThreads, 0, s, keep, n, d);
  }
  FLS_CUDA_RETURN_LAST_ERROR();
}

int bias_act_dropout_fwd(const BiasActDropoutFwdParams& p, void* stream) {
  const void *x = p.x, *bias = p.bias, *residual = p.residual;
  void* y = p.y;
  const int64_t rows = p.rows, cols = p.cols;
  const DropoutParams& d = p.drop;
  const int64_t* rm = p.row_map;
  if (rows * cols == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  FLS_CUDA_DISPATCH(
      p.dtype, if (residual != nullptr) {
        launch_fwd<scalar_t, Act::kIdentity, true>(x, bias, residual, y, rows, cols, d, rm, s);
      } else {
        switch (p.act) {
          case Act::kIdentity: launch_fwd<scalar_t, Act::kIdentity, false>(x, bias, nullptr, y, rows, cols, d, rm, s); break;
          case Act::kRelu: launch_fwd<scalar_t, Act::kRelu, false>(x, bias, nullptr, y, rows, cols, d, rm, s); break;
          case Act::kGelu: launch_fwd<scalar_t, Act::kGelu, false>(x, bias, nullptr, y, rows, cols, d, rm, s); break;
          case Act::kGeluTanh: launch_fwd<scalar_t, Act::kGeluTanh, false>(x, bias, nullptr, y, rows, cols, d, rm, s); break;
        }
      });
  FLS_CUDA_RETURN_LAST_ERROR();
}

// Enough for both backward paths: the fast path's chunks are >= kRowsPerChunk rows.
int64_t bias_act_dropout_bwd_workspace(int64_t rows, int64_t cols) { return num_chunks(rows) * cols; }

int bias_act_dropout_bwd(const BiasActDropoutBwdParams& p, float* workspace, void* stream) {
  const void *dy = p.dy, *x = p.x, *bias = p.bias;
  void *dx = p.dx, *dbias = p.dbias;
  const int64_t rows = p.rows, cols = p.cols;
  const DropoutParams& d = p.drop;
  const int64_t* rm = p.row_map;
  if (cols == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  FLS_CUDA_DISPATCH(
      p.dtype, switch (p.act) {
        case Act::kIdentity: launch_bwd<scalar_t, Act::kIdentity>(dy, x, bias, dx, dbias, workspace, rows, cols, d, rm, s); break;
        case Act::kRelu: launch_bwd<scalar_t, Act::kRelu>(dy, x, bias, dx, dbias, workspace, rows, cols, d, rm, s); break;
        case Act::kGelu: launch_bwd<scalar_t, Act::kGelu>(dy, x, bias, dx, dbias, workspace, rows, cols, d, rm, s); break;
        case Act::kGeluTanh: launch_bwd<scalar_t, Act::kGeluTanh>(dy, x, bias, dx, dbias, workspace, rows, cols, d, rm, s); break;
      });
  FLS_CUDA_RETURN_LAST_ERROR();
}

}  // namespace cuda
}  // namespace fls
