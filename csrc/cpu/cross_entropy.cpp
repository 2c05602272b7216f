// Label-smoothed cross entropy on CPU: a row per task item, max and sums in one vectorised pass, fp32 math
// (float64 for gradcheck).
#include "../kernels/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "cpu_common.h"
#include "fls/fast_math.h"
#include "fls/label_smoothing.h"

namespace fls {
namespace cpu {
namespace {

// exp(x) for x <= 0 (x = z - max or z - lse; rounding may make it a few ulp positive, which is
// harmless): fls::exp_nonpos_f32 (fls/fast_math.h), plain arithmetic that `#pragma omp simd` loops
// vectorise; std::exp is a scalar library call. x below about -88 gives 0, negligible next to the
// row sum >= 1 and in p_v.
__attribute__((always_inline)) inline float exp_nonpos_acc(float x) { return exp_nonpos_f32(x); }
inline double exp_nonpos_acc(double x) { return std::exp(x); }  // float64: gradcheck only

constexpr int64_t kSumBlock = 512;

template <typename T>
inline int64_t grain_rows(int64_t V) {
  return std::max<int64_t>(1, 32768 / std::max<int64_t>(V, 1));
}

// The two row loops, inlined into the per-ISA clones of FLS_CPU_CLONES (cpu_common.h) below.
template <typename T, typename A>
__attribute__((always_inline)) inline void row_stats_impl(const T* z, int64_t V, A& m_out, A& s_out, A& d_out) {
  A m = -std::numeric_limits<A>::infinity();
#pragma omp simd reduction(max : m)
  for (int64_t v = 0; v < V; ++v) {
    const A x = static_cast<A>(z[v]);
    m = x > m ? x : m;
  }
  // Summed in blocks of kSumBlock (vector lanes within a block, then block totals), so the
  // rounding error grows with kSumBlock + V / kSumBlock rather than with V. 8 partial sums per block
  // whatever the clone's vector width, so every clone rounds alike: element v0 + 8i + k goes to lane
  // k, the last V % 8 elements of a block to lane 0, and the lanes are added 0 to 7 (the order of the
  // `omp simd simdlen(8)` reduction this replaced, bit for bit). The exps run 16 at a time, which
  // the AVX-512 clone does in one vector; lanes then take elements 0-7 and 8-15 in turn, the same
  // order as two steps of 8.
  A s = 0, d = 0;
  for (int64_t v0 = 0; v0 < V; v0 += kSumBlock) {
    const int64_t v1 = std::min(V, v0 + kSumBlock);
    if constexpr (std::is_same<A, double>::value) {
      // float64 (gradcheck only): std::exp does not vectorise, and the omp simd loop this replaced
      // ran in element order.
      A sb = 0, db = 0;
      for (int64_t v = v0; v < v1; ++v) {
        const A x = static_cast<A>(z[v]) - m;
        sb += exp_nonpos_acc(x);
        db -= x;
      }
      s += sb;
      d += db;
      continue;
    }
    A sb[8] = {}, db[8] = {};
    int64_t v = v0;
    for (; v + 16 <= v1; v += 16) {
      A x[16], e[16];
#pragma omp simd
      for (int k = 0; k < 16; ++k) {
        x[k] = static_cast<A>(z[v + k]) - m;
        e[k] = exp_nonpos_acc(x[k]);
      }
      for (int h = 0; h < 16; h += 8)
#pragma omp simd
        for (int k = 0; k < 8; ++k) {
          sb[k] += e[h + k];
          db[k] -= x[h + k];
        }
    }
    for (; v + 8 <= v1; v += 8)
#pragma omp simd
      for (int k = 0; k < 8; ++k) {
        const A x = static_cast<A>(z[v + k]) - m;
        sb[k] += exp_nonpos_acc(x);
        db[k] -= x;
      }
    for (; v < v1; ++v) {
      const A x = static_cast<A>(z[v]) - m;
      sb[0] += exp_nonpos_acc(x);
      db[0] -= x;
    }
    A sbt = 0, dbt = 0;
    for (int k = 0; k < 8; ++k) {
      sbt += sb[k];
      dbt += db[k];
    }
    s += sbt;
    d += dbt;
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
void fwd_typed(const T* logits, const int64_t* target, acc_t<T>* loss, acc_t<T>* nll, acc_t<T>* lse, int64_t rows,
               int64_t V, double epsilon, int64_t ignore_index) {
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
void bwd_typed(const acc_t<T>* dloss, const acc_t<T>* dnll, const T* logits, const int64_t* target,
               const acc_t<T>* lse, T* dlogits, int64_t rows, int64_t V, double epsilon, int64_t ignore_index) {
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

void ls_cross_entropy_fwd(const LsCrossEntropyFwdParams& p) {
  FLS_CPU_DISPATCH(p.dtype, using A = acc_t<scalar_t>;
                   fwd_typed<scalar_t>(static_cast<const scalar_t*>(p.logits), p.target, static_cast<A*>(p.loss),
                                       static_cast<A*>(p.nll), static_cast<A*>(p.lse), p.rows, p.V, p.epsilon,
                                       p.ignore_index));
}

void ls_cross_entropy_bwd(const LsCrossEntropyBwdParams& p) {
  FLS_CPU_DISPATCH(p.dtype, using A = acc_t<scalar_t>;
                   bwd_typed<scalar_t>(static_cast<const A*>(p.dloss), static_cast<const A*>(p.dnll),
                                       static_cast<const scalar_t*>(p.logits), p.target, static_cast<const A*>(p.lse),
                                       static_cast<scalar_t*>(p.dlogits), p.rows, p.V, p.epsilon, p.ignore_index));
}

}  // namespace cpu
}  // namespace fls
