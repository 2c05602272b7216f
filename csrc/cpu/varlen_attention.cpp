// Varlen attention on CPU: one work item per (sentence, head) over its contiguous rows, math in acc_t
// (float64 for float64, else float32). An item owns its sentence's query rows and, in backward, its key rows
// of that head, so the gradients are written without atomics and do not depend on the thread count.
#include "../kernels/varlen_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu_common.h"
#include "philox_batch.h"

namespace fls {
namespace cpu {
namespace {

// x . y in A; omp simd: a vectorised reduction (a fixed order for a given n, so still deterministic).
template <typename A, typename T>
inline A dot(const T* x, const T* y, int64_t n) {
  A s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t d = 0; d < n; ++d) s += static_cast<A>(x[d]) * static_cast<A>(y[d]);
  return s;
}

// The rows of one (sentence, head): row r of a [N, H, D] tensor at base + (r * H) * D.
struct Item {
  int64_t b, h, q0, Lq, k0, Lk;
};

inline Item item_of(const VarlenProblem& s, int64_t bh) {
  const int64_t b = bh / s.H;
  const int64_t q0 = s.cu_seqlens_q[b], k0 = s.cu_seqlens_k[b];
  return {b, bh % s.H, q0, s.cu_seqlens_q[b + 1] - q0, k0, s.cu_seqlens_k[b + 1] - k0};
}

// Work items per parallel chunk: about 32k multiply-adds of q.k per chunk (cpu_common.h's grain_for).
inline int64_t item_grain(const VarlenProblem& s) {
  return grain_for(std::max<int64_t>(1, s.max_seqlen_q) * std::max<int64_t>(1, s.max_seqlen_k) * s.D);
}

// fac[j] = dropout multiplier of key j of query i (1 when dropout is off), j < n.
template <typename A>
inline void row_factors(const VarlenProblem& s, const Item& it, int64_t i, int64_t n, std::vector<uint32_t>& u,
                        A* fac) {
  if (s.drop.threshold == 0) {
    std::fill(fac, fac + n, A(1));
    return;
  }
  u.resize(dropout_words(n));
  dropout_select(s.drop.offset + varlen_row_stream(s, it.b, it.h, i), n, s.drop, u.data(),
                 static_cast<A>(s.drop.scale), A(0), fac);
}

// z[j] = scale * q_i . k_j for the n keys query i sees.
template <typename T, typename A>
inline void row_scores(const VarlenProblem& s, const T* qi, const T* k, const Item& it, int64_t n, A* z) {
  const int64_t H = s.H, D = s.D;
  for (int64_t j = 0; j < n; ++j) z[j] = static_cast<A>(s.scale) * dot<A>(qi, k + ((it.k0 + j) * H + it.h) * D, D);
}

template <typename T>
void fwd_impl(const VarlenAttentionFwdParams& p) {
  using A = acc_t<T>;
  const VarlenProblem& s = p.s;
  const int64_t H = s.H, D = s.D;
  const T* q = static_cast<const T*>(p.q);
  const T* k = static_cast<const T*>(p.k);
  const T* v = static_cast<const T*>(p.v);
  T* out = static_cast<T*>(p.out);
  A* lse = static_cast<A*>(p.lse);
  parallel_for(s.B * H, item_grain(s), [&](int64_t begin, int64_t end) {
    std::vector<A> z, fac, acc(D);
    std::vector<uint32_t> u;
    for (int64_t bh = begin; bh < end; ++bh) {
      const Item it = item_of(s, bh);
      for (int64_t i = 0; i < it.Lq; ++i) {
        const int64_t row = (it.q0 + i) * H + it.h;
        const int64_t n = varlen_key_end(s.causal, i, it.Lq, it.Lk);
        z.resize(n);
        fac.resize(n);
        row_scores(s, q + row * D, k, it, n, z.data());
        A m = -std::numeric_limits<A>::infinity();
        for (int64_t j = 0; j < n; ++j) m = std::max(m, z[j]);
        A sum = 0;
        for (int64_t j = 0; j < n; ++j) {
          z[j] = std::exp(z[j] - m);
          sum += z[j];
        }
        row_factors(s, it, i, n, u, fac.data());
        std::fill(acc.begin(), acc.end(), A(0));
        for (int64_t j = 0; j < n; ++j) {
          const A w = z[j] / sum * fac[j];
          const T* vj = v + ((it.k0 + j) * H + it.h) * D;
          for (int64_t d = 0; d < D; ++d) acc[d] += w * static_cast<A>(vj[d]);
        }
        for (int64_t d = 0; d < D; ++d) out[row * D + d] = static_cast<T>(acc[d]);
        lse[row] = n ? m + std::log(sum) : -std::numeric_limits<A>::infinity();
      }
    }
  });
}

// Per query i: P_j = exp(z_j - lse_i), dP_j = fac_j * (dout_i . v_j), dS_j = P_j (dP_j - sum_j P_j dP_j);
// dq_i = scale * sum_j dS_j k_j, dk_j += scale * dS_j q_i, dv_j += P_j fac_j dout_i (dk, dv of the item's keys
// accumulated in acc_t, written once at the end).
template <typename T>
void bwd_impl(const VarlenAttentionBwdParams& p) {
  using A = acc_t<T>;
  const VarlenProblem& s = p.s;
  const int64_t H = s.H, D = s.D;
  const T* dout = static_cast<const T*>(p.dout);
  const T* q = static_cast<const T*>(p.q);
  const T* k = static_cast<const T*>(p.k);
  const T* v = static_cast<const T*>(p.v);
  const A* lse = static_cast<const A*>(p.lse);
  T* dq = static_cast<T*>(p.dq);
  T* dk = static_cast<T*>(p.dk);
  T* dv = static_cast<T*>(p.dv);
  const A sc = static_cast<A>(s.scale);
  parallel_for(s.B * H, item_grain(s), [&](int64_t begin, int64_t end) {
    std::vector<A> z, fac, dp, dq_acc(D), dk_acc, dv_acc;
    std::vector<uint32_t> u;
    for (int64_t bh = begin; bh < end; ++bh) {
      const Item it = item_of(s, bh);
      dk_acc.assign(it.Lk * D, A(0));
      dv_acc.assign(it.Lk * D, A(0));
      for (int64_t i = 0; i < it.Lq; ++i) {
        const int64_t row = (it.q0 + i) * H + it.h;
        const int64_t n = varlen_key_end(s.causal, i, it.Lq, it.Lk);
        const T* qi = q + row * D;
        const T* gi = dout + row * D;
        z.resize(n);
        fac.resize(n);
        dp.resize(n);
        row_scores(s, qi, k, it, n, z.data());
        row_factors(s, it, i, n, u, fac.data());
        A rowsum = 0;
        for (int64_t j = 0; j < n; ++j) {
          z[j] = std::exp(z[j] - lse[row]);
          dp[j] = fac[j] * dot<A>(gi, v + ((it.k0 + j) * H + it.h) * D, D);
          rowsum += z[j] * dp[j];
        }
        std::fill(dq_acc.begin(), dq_acc.end(), A(0));
        for (int64_t j = 0; j < n; ++j) {
          const A ds = z[j] * (dp[j] - rowsum), pd = z[j] * fac[j];
          const T* kj = k + ((it.k0 + j) * H + it.h) * D;
          A* dkj = dk_acc.data() + j * D;
          A* dvj = dv_acc.data() + j * D;
          for (int64_t d = 0; d < D; ++d) {
            dq_acc[d] += ds * static_cast<A>(kj[d]);
            dkj[d] += ds * static_cast<A>(qi[d]);
            dvj[d] += pd * static_cast<A>(gi[d]);
          }
        }
        for (int64_t d = 0; d < D; ++d) dq[row * D + d] = static_cast<T>(sc * dq_acc[d]);
      }
      for (int64_t j = 0; j < it.Lk; ++j) {
        const int64_t row = (it.k0 + j) * H + it.h;
        for (int64_t d = 0; d < D; ++d) {
          dk[row * D + d] = static_cast<T>(sc * dk_acc[j * D + d]);
          dv[row * D + d] = static_cast<T>(dv_acc[j * D + d]);
        }
      }
    }
  });
}

}  // namespace

void varlen_attention_fwd(const VarlenAttentionFwdParams& p) { FLS_CPU_DISPATCH(p.dtype, fwd_impl<scalar_t>(p)); }

void varlen_attention_bwd(const VarlenAttentionBwdParams& p) { FLS_CPU_DISPATCH(p.dtype, bwd_impl<scalar_t>(p)); }

}  // namespace cpu
}  // namespace fls
