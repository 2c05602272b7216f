#include "layer_norm.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace fls {
namespace cpu {

template <typename T>
void layer_norm_fwd(const T* x, const T* weight, const T* bias, T* y, acc_t<T>* mean, acc_t<T>* rstd,
                    int64_t rows, int64_t cols, double eps) {
  using A = acc_t<T>;
  parallel_for(rows, grain_for(cols), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * cols;
      T* yr = y + r * cols;
      // Two passes (mean, then centred squares): stable for inputs with a large mean.
      // omp simd: lets the compiler reorder (vectorise) the reductions, which strict IEEE forbids.
      A sum = 0;
#pragma omp simd reduction(+ : sum)
      for (int64_t c = 0; c < cols; ++c) sum += static_cast<A>(xr[c]);
      const A mu = sum / static_cast<A>(cols);
      A sq = 0;
#pragma omp simd reduction(+ : sq)
      for (int64_t c = 0; c < cols; ++c) {
        const A d = static_cast<A>(xr[c]) - mu;
        sq += d * d;
      }
      const A rs = A(1) / std::sqrt(sq / static_cast<A>(cols) + static_cast<A>(eps));
      for (int64_t c = 0; c < cols; ++c) {
        const A xh = (static_cast<A>(xr[c]) - mu) * rs;
        yr[c] = static_cast<T>(xh * static_cast<A>(weight[c]) + static_cast<A>(bias[c]));
      }
      mean[r] = mu;
      rstd[r] = rs;
    }
  });
}

template <typename T>
void layer_norm_bwd(const T* dy, const T* x, const T* weight, const acc_t<T>* mean, const acc_t<T>* rstd, T* dx,
                    T* dweight, T* dbias, int64_t rows, int64_t cols) {
  using A = acc_t<T>;
  // One pass over fixed chunks of rows: dx row by row, and each chunk's partial column sums of
  // dweight/dbias; the partials are then added in chunk order. The chunking does not depend on the
  // thread count, so neither does the result.
  constexpr int64_t kChunk = 32;
  const int64_t chunks = (rows + kChunk - 1) / kChunk;
  if (chunks == 0) {  // no rows: zero gradients
    std::fill(dweight, dweight + cols, static_cast<T>(0));
    std::fill(dbias, dbias + cols, static_cast<T>(0));
    return;
  }
  std::vector<A> pw(chunks * cols, A(0)), pb(chunks * cols, A(0));
  const A inv_n = A(1) / static_cast<A>(cols);
  parallel_for(chunks, grain_for(kChunk * cols), [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      A* sw = pw.data() + k * cols;
      A* sb = pb.data() + k * cols;
      const int64_t r1 = std::min(rows, (k + 1) * kChunk);
      for (int64_t r = k * kChunk; r < r1; ++r) {
        const T* dyr = dy + r * cols;
        const T* xr = x + r * cols;
        T* dxr = dx + r * cols;
        const A mu = mean[r], rs = rstd[r];
        A s_g = 0, s_gx = 0;  // sum(w*dy), sum(w*dy*xhat)
        // Three simple loops over a row that sits in L1 vectorise better than one loop doing
        // reductions and array updates at once.
#pragma omp simd reduction(+ : s_g, s_gx)
        for (int64_t c = 0; c < cols; ++c) {
          const A gw = static_cast<A>(dyr[c]) * static_cast<A>(weight[c]);
          s_g += gw;
          s_gx += gw * ((static_cast<A>(xr[c]) - mu) * rs);
        }
        s_g *= inv_n;
        s_gx *= inv_n;
#pragma omp simd
        for (int64_t c = 0; c < cols; ++c) {
          const A xh = (static_cast<A>(xr[c]) - mu) * rs;
          dxr[c] = static_cast<T>(rs * (static_cast<A>(dyr[c]) * static_cast<A>(weight[c]) - s_g - xh * s_gx));
        }
#pragma omp simd
        for (int64_t c = 0; c < cols; ++c) {
          const A g = static_cast<A>(dyr[c]);
          sw[c] += g * ((static_cast<A>(xr[c]) - mu) * rs);
          sb[c] += g;
        }
      }
    }
  });
  // Chunk sums added in chunk order, a column block per task (rows of pw/pb are contiguous).
  parallel_for(cols, std::max<int64_t>(64, grain_for(chunks)), [&](int64_t begin, int64_t end) {
    std::vector<A> w(pw.begin() + begin, pw.begin() + end), b(pb.begin() + begin, pb.begin() + end);
    for (int64_t k = 1; k < chunks; ++k) {
      const A* pwk = pw.data() + k * cols;
      const A* pbk = pb.data() + k * cols;
#pragma omp simd
      for (int64_t c = begin; c < end; ++c) {
        w[c - begin] += pwk[c];
        b[c - begin] += pbk[c];
      }
    }
    for (int64_t c = begin; c < end; ++c) {
      dweight[c] = static_cast<T>(w[c - begin]);
      dbias[c] = static_cast<T>(b[c - begin]);
    }
  });
}

#define FLS_INSTANTIATE_LN(T)                                                                                 \
  template void layer_norm_fwd<T>(const T*, const T*, const T*, T*, acc_t<T>*, acc_t<T>*, int64_t, int64_t, \
                                  double);                                                                  \
  template void layer_norm_bwd<T>(const T*, const T*, const T*, const acc_t<T>*, const acc_t<T>*, T*, T*, T*, \
                                  int64_t, int64_t);
FLS_CPU_INSTANTIATE(FLS_INSTANTIATE_LN)

}  // namespace cpu
}  // namespace fls
