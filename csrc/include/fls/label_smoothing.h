// Per-row and per-element terms of fairseq's label-smoothed cross entropy, shared by the CPU and
// CUDA kernels (csrc/{cpu,cuda}/cross_entropy.*), so the CPU tests check the formulas the GPU runs.
//
// For one row of logits z[0..V) with target t, p = softmax(z), lse = logsumexp(z):
//   eps_i  = eps / (V - 1)                      (0 when V == 1, as the reference)
//   a      = 1 - eps - eps_i
//   nll    = lse - z_t
//   smooth = sum_v (lse - z_v) = V * log(s) + sum_v (m - z_v),   m = max(z), s = sum_v exp(z_v - m)
//   loss   = a * nll + eps_i * smooth
// smooth is written as two sums of non-negative terms (no V*lse - sum(z) cancellation for large V).
//
// Gradient, with upstream gradients dloss and dnll of the row:
//   d nll / dz_v    = p_v - [v == t]
//   d smooth / dz_v = V * p_v - 1
//   dz_v = dloss * (a * (p_v - [v==t]) + eps_i * (V p_v - 1)) + dnll * (p_v - [v==t])
//        = c_p * p_v - c_0 - [v == t] * c_t
// with c_p = dloss * (a + eps_i * V) + dnll, c_0 = dloss * eps_i, c_t = dloss * a + dnll
// (a + eps_i * V == 1 for V > 1). Ignored rows have zero loss/nll outputs, so all three are 0.
#pragma once
#include "fls/common.h"

namespace fls {

template <typename A>
struct LsCoef {
  A a;      // weight of nll: 1 - eps - eps_i
  A eps_i;  // weight of the smoothing sum: eps / (V - 1)
  A V;      // vocabulary size as A
};

template <typename A>
FLS_HD LsCoef<A> ls_coef(double epsilon, int64_t V) {
  LsCoef<A> c;
  const double eps_i = V > 1 ? epsilon / static_cast<double>(V - 1) : 0.0;
  c.a = static_cast<A>(1.0 - epsilon - eps_i);
  c.eps_i = static_cast<A>(eps_i);
  c.V = static_cast<A>(V);
  return c;
}

// Row results from the running statistics: m = max(z), log_s = log(sum exp(z - m)),
// sum_m_minus_z = sum_v (m - z_v) >= 0, zt = z[target].
template <typename A>
FLS_HD void ls_row_loss(const LsCoef<A>& c, A log_s, A sum_m_minus_z, A m, A zt, A* loss, A* nll) {
  const A n = log_s + (m - zt);
  const A smooth = c.V * log_s + sum_m_minus_z;
  *nll = n;
  *loss = c.a * n + c.eps_i * smooth;
}

template <typename A>
struct LsGradCoef {
  A c_p;  // multiplies p_v
  A c_0;  // subtracted from every element
  A c_t;  // subtracted from the target element
};

template <typename A>
FLS_HD LsGradCoef<A> ls_grad_coef(const LsCoef<A>& c, A dloss, A dnll) {
  LsGradCoef<A> g;
  g.c_p = dloss * (c.a + c.eps_i * c.V) + dnll;
  g.c_0 = dloss * c.eps_i;
  g.c_t = dloss * c.a + dnll;
  return g;
}

// dz_v for a non-target element (p = softmax probability of v); the target element also
// subtracts g.c_t.
template <typename A>
FLS_HD A ls_grad(const LsGradCoef<A>& g, A p) {
  return g.c_p * p - g.c_0;
}

}  // namespace fls
