// Layer norm on CPU: a row per task item, two passes over the row (mean, then centred squares); backward
// writes dx row by row and sums the dweight/dbias columns over fixed row chunks, then in chunk order.
#include "../kernels/layer_norm.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <type_traits>

#include "column_sum.h"
#include "cpu_common.h"

namespace fls {
namespace cpu {

// The row loops are templates over the storage type; the float32 instances are called through
// FLS_CPU_CLONES wrappers (cpu_common.h) so they also run as AVX-512 where the CPU has it, like
// torch's own layer norm. Overload resolution picks the float wrapper over the template for float;
// double (gradcheck) and BFloat16 call the template directly. always_inline: otherwise gcc may
// call one shared baseline copy of the template from every clone, which then runs no AVX-512.

// Lanes of the omp simd loop in row_sum, per storage type T, as gcc builds it: 16 floats in the
// AVX-512 clone; double and bfloat16 rows run baseline (-march=x86-64-v3, setup.py) code, which
// takes 4 doubles and 16 bf16 elements (found by comparing outputs bit for bit over n = 1..300).
// The AVX2 clone's float loop has 8 lanes: on a CPU without AVX-512, float rows of 32 <= n < 64
// now take the plain-order path too, and round as on AVX-512 CPUs (they differed before).
template <typename T>
constexpr int64_t kSimdLanes = std::is_same<T, double>::value ? 4 : 16;

// Sum of f(x[c]) over a row of n, as four partial sums over the row's quarters. A single vector
// accumulator is latency bound once the row is in L1 (one add every ~4 cycles, gcc does not split
// it); four independent ones are not. The quarters keep every load stream contiguous.
template <typename T, typename F>
__attribute__((always_inline)) inline acc_t<T> row_sum(const T* x, int64_t n, F f) {
  using A = acc_t<T>;
  const int64_t q = n / 4;
  const T *x1 = x + q, *x2 = x + 2 * q, *x3 = x + 3 * q;
  A s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  if (q < kSimdLanes<T>) {
    // Short rows (float: n < 64): the vector loop below would not run a single iteration, and gcc's
    // omp simd reduction then still adds up its 16 (zero) lanes one after the other from the stack,
    // 64 dependent adds per call: most of the forward's time at n = 32. Sums in plain element
    // order are what that loop computes then (its lanes start at +0, so adding them changes nothing).
    for (int64_t c = 0; c < q; ++c) {
      s0 += f(static_cast<A>(x[c]));
      s1 += f(static_cast<A>(x1[c]));
      s2 += f(static_cast<A>(x2[c]));
      s3 += f(static_cast<A>(x3[c]));
    }
  } else {
    // omp simd: lets the compiler reorder (vectorise) the sums, which strict IEEE forbids.
#pragma omp simd reduction(+ : s0, s1, s2, s3)
    for (int64_t c = 0; c < q; ++c) {
      s0 += f(static_cast<A>(x[c]));
      s1 += f(static_cast<A>(x1[c]));
      s2 += f(static_cast<A>(x2[c]));
      s3 += f(static_cast<A>(x3[c]));
    }
  }
  for (int64_t c = 4 * q; c < n; ++c) s0 += f(static_cast<A>(x[c]));
  return (s0 + s1) + (s2 + s3);
}

// Mean and rstd of one row. Two passes (mean, then centred squares): stable for inputs with a large
// mean; the row is in L1 for the second pass.
template <typename T>
__attribute__((always_inline)) inline void row_stats(const T* x, int64_t n, acc_t<T> eps, acc_t<T>* mean,
                                                     acc_t<T>* rstd) {
  using A = acc_t<T>;
  const A mu = row_sum(x, n, [](A v) { return v; }) / static_cast<A>(n);
  const A sq = row_sum(x, n, [mu](A v) { return (v - mu) * (v - mu); });
  *mean = mu;
  *rstd = A(1) / std::sqrt(sq / static_cast<A>(n) + eps);
}

// One row of the output: y = (x - mean) * rstd * weight + bias.
template <typename T>
__attribute__((always_inline)) inline void row_out(const T* x, const T* weight, const T* bias, acc_t<T> mu,
                                                   acc_t<T> rs, T* y, int64_t n) {
  using A = acc_t<T>;
#pragma omp simd
  for (int64_t c = 0; c < n; ++c) {
    const A xh = (static_cast<A>(x[c]) - mu) * rs;
    y[c] = static_cast<T>(xh * static_cast<A>(weight[c]) + static_cast<A>(bias[c]));
  }
}

// One row of the backward: dx, and the row's terms of the dweight (dy * xhat) and dbias (dy) column
// sums, added into sw/sb; the first row of a chunk writes them instead (no zero-filled buffer).
template <typename T>
__attribute__((always_inline)) inline void bwd_row(const T* dy, const T* x, const T* weight, acc_t<T> mu,
                                                   acc_t<T> rs, T* dx, acc_t<T>* sw, acc_t<T>* sb, int64_t n,
                                                   bool first) {
  using A = acc_t<T>;
  // Pass 1 does the row reductions and the column sums together, so dy and x come from memory
  // once (it was a separate third pass before); pass 2 (dx) finds the row in L1. Two copies of
  // pass 1 so the write/accumulate choice is not made per element.
  A s_g = 0, s_gx = 0;  // sum(w * dy), sum(w * dy * xhat)
  if (first) {
#pragma omp simd reduction(+ : s_g, s_gx)
    for (int64_t c = 0; c < n; ++c) {
      const A g = static_cast<A>(dy[c]), xh = (static_cast<A>(x[c]) - mu) * rs, gw = g * static_cast<A>(weight[c]);
      s_g += gw;
      s_gx += gw * xh;
      sw[c] = g * xh;
      sb[c] = g;
    }
  } else {
#pragma omp simd reduction(+ : s_g, s_gx)
    for (int64_t c = 0; c < n; ++c) {
      const A g = static_cast<A>(dy[c]), xh = (static_cast<A>(x[c]) - mu) * rs, gw = g * static_cast<A>(weight[c]);
      s_g += gw;
      s_gx += gw * xh;
      sw[c] += g * xh;
      sb[c] += g;
    }
  }
  const A inv_n = A(1) / static_cast<A>(n);
  s_g *= inv_n;
  s_gx *= inv_n;
#pragma omp simd
  for (int64_t c = 0; c < n; ++c) {
    const A xh = (static_cast<A>(x[c]) - mu) * rs;
    dx[c] = static_cast<T>(rs * (static_cast<A>(dy[c]) * static_cast<A>(weight[c]) - s_g - xh * s_gx));
  }
}
FLS_CPU_CLONES void bwd_row(const float* dy, const float* x, const float* weight, float mu, float rs, float* dx,
                            float* sw, float* sb, int64_t n, bool first) {
  bwd_row<float>(dy, x, weight, mu, rs, dx, sw, sb, n, first);
}

// Asks for the start of the next row while this row is worked on from L1: the forward alternates
// a pass that loads from memory with passes that only touch L1, and the hardware prefetcher alone
// leaves the memory idle during the latter. Measured at 4096x512/1024 on one thread: ~15-20%
// faster forward; the first 2 KiB beat the whole row at 1024 columns (too many misses in flight,
// and the hardware prefetcher takes over along the row). The backward's first pass does enough
// work per load that prefetching there did not help.
template <typename T>
inline void prefetch_row_start(const T* p, int64_t n) {
  constexpr int64_t kLine = 64 / sizeof(T), kMax = 2048 / sizeof(T);
  const int64_t end = std::min(n, kMax);
  for (int64_t c = 0; c < end; c += kLine) __builtin_prefetch(p + c);
}

// Rows [0, rows) of the forward, in blocks of rows that fit in L1 (one row from 4 KiB up): first the
// block's statistics, then its outputs. A short row's statistics are one dependent chain (sums,
// divide, sqrt) of ~100 cycles over a few loads; in a loop of their own the CPU runs several rows'
// chains at once (1.4x faster at n = 32 than statistics and output row by row).
template <typename T>
__attribute__((always_inline)) inline void fwd_rows(const T* x, const T* weight, const T* bias, T* y,
                                                    acc_t<T>* mean, acc_t<T>* rstd, int64_t rows, int64_t n,
                                                    acc_t<T> eps) {
  const int64_t block = std::max<int64_t>(1, 4096 / (n * static_cast<int64_t>(sizeof(T))));
  for (int64_t r0 = 0; r0 < rows; r0 += block) {
    const int64_t r1 = std::min(rows, r0 + block);
    for (int64_t r = r0; r < r1; ++r) {
      if (r + 1 < rows) prefetch_row_start(x + (r + 1) * n, n);
      row_stats(x + r * n, n, eps, mean + r, rstd + r);
    }
    for (int64_t r = r0; r < r1; ++r) row_out(x + r * n, weight, bias, mean[r], rstd[r], y + r * n, n);
  }
}
FLS_CPU_CLONES void fwd_rows(const float* x, const float* weight, const float* bias, float* y, float* mean,
                             float* rstd, int64_t rows, int64_t n, float eps) {
  fwd_rows<float>(x, weight, bias, y, mean, rstd, rows, n, eps);
}

template <typename T>
void fwd_impl(const T* x, const T* weight, const T* bias, T* y, acc_t<T>* mean, acc_t<T>* rstd, int64_t rows,
              int64_t cols, double eps) {
  parallel_for(rows, grain_for(cols), [&](int64_t begin, int64_t end) {
    fwd_rows(x + begin * cols, weight, bias, y + begin * cols, mean + begin, rstd + begin, end - begin, cols,
             static_cast<acc_t<T>>(eps));
  });
}

template <typename T>
void bwd_impl(const T* dy, const T* x, const T* weight, const acc_t<T>* mean, const acc_t<T>* rstd, T* dx,
              T* dweight, T* dbias, int64_t rows, int64_t cols) {
  using A = acc_t<T>;
  // dx row by row, and per fixed chunk of rows the partial column sums of dweight/dbias, which are
  // then added in chunk order. The chunking does not depend on the thread count, so neither does
  // the result.
  constexpr int64_t kChunk = 32;
  const int64_t chunks = (rows + kChunk - 1) / kChunk;
  // Uninitialised: every chunk's first row writes its partial sums.
  std::unique_ptr<A[]> pw(new A[chunks * cols]), pb(new A[chunks * cols]);
  parallel_for(chunks, grain_for(kChunk * cols), [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      const int64_t r0 = k * kChunk, r1 = std::min(rows, r0 + kChunk);
      for (int64_t r = r0; r < r1; ++r)
        bwd_row(dy + r * cols, x + r * cols, weight, mean[r], rstd[r], dx + r * cols, pw.get() + k * cols,
                pb.get() + k * cols, cols, r == r0);
    }
  });
  column_sum(pw.get(), dweight, chunks, cols);  // no rows (no chunks): zeros
  column_sum(pb.get(), dbias, chunks, cols);
}

void layer_norm_fwd(const LayerNormFwdParams& p) {
  FLS_CPU_DISPATCH(p.dtype, using A = acc_t<scalar_t>;
                   fwd_impl<scalar_t>(static_cast<const scalar_t*>(p.x), static_cast<const scalar_t*>(p.weight),
                                      static_cast<const scalar_t*>(p.bias), static_cast<scalar_t*>(p.y),
                                      static_cast<A*>(p.mean), static_cast<A*>(p.rstd), p.rows, p.cols, p.eps));
}

void layer_norm_bwd(const LayerNormBwdParams& p) {
  FLS_CPU_DISPATCH(p.dtype, using A = acc_t<scalar_t>;
                   bwd_impl<scalar_t>(static_cast<const scalar_t*>(p.dy), static_cast<const scalar_t*>(p.x),
                                      static_cast<const scalar_t*>(p.weight), static_cast<const A*>(p.mean),
                                      static_cast<const A*>(p.rstd), static_cast<scalar_t*>(p.dx),
                                      static_cast<scalar_t*>(p.dweight), static_cast<scalar_t*>(p.dbias), p.rows,
                                      p.cols));
}

}  // namespace cpu
}  // namespace fls
