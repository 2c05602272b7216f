#include "layer_norm.h"

#include <cmath>
#include <vector>

namespace fls {
namespace cpu {

template <typename T>
void layer_norm_fwd(const T* x, const T* weight, const T* bias, T* y, acc_t<T>* mean, acc_t<T>* rstd,
                    int64_t rows, int64_t cols, double eps) {
  using A = acc_t<T>;
  parallel_for(rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * cols;
      T* yr = y + r * cols;
      // Two passes (mean, then centred squares): stable for inputs with a large mean.
      A sum = 0;
      for (int64_t c = 0; c < cols; ++c) sum += static_cast<A>(xr[c]);
      const A mu = sum / static_cast<A>(cols);
      A sq = 0;
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
  // dx row by row.
  parallel_for(rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* dyr = dy + r * cols;
      const T* xr = x + r * cols;
      const A mu = mean[r], rs = rstd[r];
      A s_g = 0, s_gx = 0;  // sum(w*dy), sum(w*dy*xhat)
      for (int64_t c = 0; c < cols; ++c) {
        const A g = static_cast<A>(dyr[c]) * static_cast<A>(weight[c]);
        s_g += g;
        s_gx += g * (static_cast<A>(xr[c]) - mu) * rs;
      }
      const A inv_n = A(1) / static_cast<A>(cols);
      for (int64_t c = 0; c < cols; ++c) {
        const A g = static_cast<A>(dyr[c]) * static_cast<A>(weight[c]);
        const A xh = (static_cast<A>(xr[c]) - mu) * rs;
        dx[r * cols + c] = static_cast<T>(rs * (g - inv_n * s_g - xh * inv_n * s_gx));
      }
    }
  });
  // dweight/dbias: columns split across threads, each column summed over rows in order, so the
  // result does not depend on the number of threads.
  parallel_for(cols, 16, [&](int64_t begin, int64_t end) {
    std::vector<A> sw(end - begin, A(0)), sb(end - begin, A(0));
    for (int64_t r = 0; r < rows; ++r) {
      const T* dyr = dy + r * cols;
      const T* xr = x + r * cols;
      const A mu = mean[r], rs = rstd[r];
      for (int64_t c = begin; c < end; ++c) {
        const A g = static_cast<A>(dyr[c]);
        sw[c - begin] += g * (static_cast<A>(xr[c]) - mu) * rs;
        sb[c - begin] += g;
      }
    }
    for (int64_t c = begin; c < end; ++c) {
      dweight[c] = static_cast<T>(sw[c - begin]);
      dbias[c] = static_cast<T>(sb[c - begin]);
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
