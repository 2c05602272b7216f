#include "cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "fls/label_smoothing.h"

namespace fls {
namespace cpu {
namespace {

// exp(x) for x <= 0 (x = z - max or z - lse; rounding may make it a few ulp positive, which is
// harmless) in plain arithmetic (Cephes expf: range reduction by ln2, degree-6 polynomial,
// ~1 ulp), so that `#pragma omp simd` loops vectorise it; std::exp is a scalar library call.
// x below -87.3 is raised to -87.3 (result ~1e-38 instead of a denormal or 0, negligible next to
// the row sum >= 1 and in p_v). The clamp is a bit select, not a ?: on floats, which GCC does not
// if-convert (the loop would stay scalar); NaN passes through unchanged.
__attribute__((always_inline)) inline float exp_nonpos(float x) {
  const float lo = -87.3f;
  int32_t xb, lb;
  std::memcpy(&xb, &x, sizeof(xb));
  std::memcpy(&lb, &lo, sizeof(lb));
  const int32_t keep = -static_cast<int32_t>(!(x < lo));
  xb = (xb & keep) | (lb & ~keep);
  std::memcpy(&x, &xb, sizeof(x));
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

__attribute__((always_inline)) inline float exp_nonpos_acc(float x) { return exp_nonpos(x); }
inline double exp_nonpos_acc(double x) { return std::exp(x); }  // float64: gradcheck only

constexpr int64_t kSumBlock = 512;

template <typename T>
inline int64_t grain_rows(int64_t V) {
  return std::max<int64_t>(1, 32768 / std::max<int64_t>(V, 1));
}

// The two row loops, inlined into per-ISA clones below: the default clone is SSE2 (4 floats); on
// x86-64 with GCC an AVX2+FMA clone (8 floats) is picked at load time (ifunc), since the build
// flags cannot assume the machine.
template <typename T, typename A>
__attribute__((always_inline)) inline void row_stats_impl(const T* z, int64_t V, A& m_out, A& s_out, A& d_out) {
  A m = -std::numeric_limits<A>::infinity();
#pragma omp simd reduction(max : m)
  for (int64_t v = 0; v < V; ++v) {
    const A x = static_cast<A>(z[v]);
    m = x > m ? x : m;
  }
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
  m_out = m;
  s_out = s;
  d_out = d;
}

template <typename T, typename A>
__attribute__((always_inline)) inline void row_grad_impl(const T* z, int64_t V, A l, const LsGradCoef<A>& gc, T* g) {
  // Scalars in locals (g cannot alias them), so the loop vectorises; the formula of ls_grad.
  const A c_p = gc.c_p, c_0 = gc.c_0;
#pragma omp simd
  for (int64_t v = 0; v < V; ++v) {
    const A p = exp_nonpos_acc(static_cast<A>(z[v]) - l);
    g[v] = static_cast<T>(c_p * p - c_0);
  }
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define FLS_CPU_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define FLS_CPU_CLONES
#endif

#define FLS_XENT_ROWS(T, A, CLONES)                                                           \
  CLONES void row_stats(const T* z, int64_t V, A& m, A& s, A& d) { row_stats_impl(z, V, m, s, d); } \
  CLONES void row_grad(const T* z, int64_t V, A l, const LsGradCoef<A>& gc, T* g) {           \
    row_grad_impl(z, V, l, gc, g);                                                            \
  }
FLS_XENT_ROWS(float, float, FLS_CPU_CLONES)
FLS_XENT_ROWS(c10::BFloat16, float, FLS_CPU_CLONES)
FLS_XENT_ROWS(double, double, )  // float64 is for gradcheck, speed does not matter

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
      A m, s, d;
      row_stats(z, V, m, s, d);
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
      row_grad(z, V, l, gc, g);
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
