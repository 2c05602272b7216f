#include "cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "fls/label_smoothing.h"

namespace fls {
namespace cpu {
namespace {

// exp(x) for x <= 0 in plain arithmetic (Cephes expf: range reduction by ln2, degree-6 polynomial,
// ~1 ulp), so that `#pragma omp simd` loops vectorise it; std::exp is a scalar library call.
// x below -87.3 returns ~1e-38 instead of a denormal/0, which is negligible next to the row sum
// (>= 1) and in p_v. NaN stays NaN through the arithmetic of the loss.
#pragma omp declare simd notinbranch
inline float exp_nonpos(float x) {
  x = x < -87.3f ? -87.3f : x;
  x = x > 0.f ? 0.f : x;
  // round(x / ln2) by the 1.5 * 2^23 trick (exact for |n| < 2^22, no rounding-mode call).
  const float n = (x * 1.44269504088896341f + 12582912.f) - 12582912.f;
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float e = p * r * r + r + 1.f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;  // 2^n, n in [-126, 0]
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return e * scale;
}

inline float exp_nonpos_acc(float x) { return exp_nonpos(x); }
inline double exp_nonpos_acc(double x) { return std::exp(x); }  // float64: gradcheck only

constexpr int64_t kSumBlock = 512;

template <typename T>
inline int64_t grain_rows(int64_t V) {
  return std::max<int64_t>(1, 32768 / std::max<int64_t>(V, 1));
}

}  // namespace

template <typename T>
void ls_cross_entropy_fwd(const T* logits, const int64_t* target, acc_t<T>* loss, acc_t<T>* nll, acc_t<T>* lse,
                          int64_t rows, int64_t V, double epsilon, int64_t ignore_index) {
  using A = acc_t<T>;
  const LsCoef<A> c = ls_coef<A>(epsilon, V);
  parallel_for(rows, grain_rows<T>(V), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t t = target[r];
      if (t == ignore_index) {
        loss[r] = nll[r] = lse[r] = A(0);
        continue;
      }
      const T* z = logits + r * V;
      A m = -std::numeric_limits<A>::infinity();
#pragma omp simd reduction(max : m)
      for (int64_t v = 0; v < V; ++v) {
        const A x = static_cast<A>(z[v]);
        m = x > m ? x : m;
      }
      // s = sum exp(z - m); d = sum (m - z) >= 0 (the smoothing sum without cancellation).
      // Summed in blocks of kSumBlock (vector lanes within a block, then block totals), so the
      // rounding error grows with kSumBlock + V / kSumBlock rather than with V.
      A s = 0, d = 0;
      for (int64_t v0 = 0; v0 < V; v0 += kSumBlock) {
        const int64_t v1 = std::min(V, v0 + kSumBlock);
        A sb = 0, db = 0;
#pragma omp simd reduction(+ : sb, db)
        for (int64_t v = v0; v < v1; ++v) {
          const A x = static_cast<A>(z[v]) - m;
          sb += exp_nonpos_acc(x);
          db -= x;
        }
        s += sb;
        d += db;
      }
      const A log_s = std::log(s);
      ls_row_loss<A>(c, log_s, d, m, static_cast<A>(z[t]), &loss[r], &nll[r]);
      lse[r] = m + log_s;
    }
  });
}

template <typename T>
void ls_cross_entropy_bwd(const acc_t<T>* dloss, const acc_t<T>* dnll, const T* logits, const int64_t* target,
                          const acc_t<T>* lse, T* dlogits, int64_t rows, int64_t V, double epsilon,
                          int64_t ignore_index) {
  using A = acc_t<T>;
  const LsCoef<A> c = ls_coef<A>(epsilon, V);
  parallel_for(rows, grain_rows<T>(V), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      T* g = dlogits + r * V;
      const int64_t t = target[r];
      if (t == ignore_index) {
        std::fill(g, g + V, T(0));
        continue;
      }
      const T* z = logits + r * V;
      const A l = lse[r];
      const A zt = static_cast<A>(z[t]);  // read before the loop: dlogits may alias logits
      const LsGradCoef<A> gc = ls_grad_coef<A>(c, dloss[r], dnll[r]);
#pragma omp simd
      for (int64_t v = 0; v < V; ++v) {
        g[v] = static_cast<T>(ls_grad<A>(gc, exp_nonpos_acc(static_cast<A>(z[v]) - l)));
      }
      g[t] = static_cast<T>(ls_grad<A>(gc, exp_nonpos_acc(zt - l)) - gc.c_t);
    }
  });
}

#define FLS_INSTANTIATE_XENT(T)                                                                              \
  template void ls_cross_entropy_fwd<T>(const T*, const int64_t*, acc_t<T>*, acc_t<T>*, acc_t<T>*, int64_t, \
                                        int64_t, double, int64_t);                                          \
  template void ls_cross_entropy_bwd<T>(const acc_t<T>*, const acc_t<T>*, const T*, const int64_t*,         \
                                        const acc_t<T>*, T*, int64_t, int64_t, double, int64_t);
FLS_CPU_INSTANTIATE(FLS_INSTANTIATE_XENT)

}  // namespace cpu
}  // namespace fls
