// FP ops here never raise traps we care about; without this, GCC (no -ffast-math) does not compute
// the masked scores' products unconditionally and keeps the padding-mask loop scalar, a branch per key.
#pragma GCC optimize("no-trapping-math")
// Attention on CPU: softmax rows in acc_t (float rows in runtime-picked AVX-512/AVX2 clones, bf16 rows
// converted on the way in and out), and the head permutations around the attention GEMMs.
#include "../kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "column_sum.h"
#include "cpu_common.h"
#include "fls/fast_math.h"
#include "philox_batch.h"

namespace fls {
namespace cpu {
namespace {

// The float row loops below are FLS_CPU_CLONES (cpu_common.h): torch's own softmax runs AVX-512
// code, so a baseline SSE2 build alone would be ~3x slower than what we replace.

// fac[j] = dropout multiplier (1/(1-p) or 0) of stream element s0 + j, j < n; u: dropout_words(n) words.
template <typename A>
inline void dropout_factors(uint64_t s0, int64_t n, const DropoutParams& d, uint32_t* u, A* fac) {
  dropout_select(s0, n, d, u, static_cast<A>(d.scale), A(0), fac);
}

// Reductions with 16 independent accumulators: a fixed order (deterministic) that vectorises.
template <typename A>
inline A row_max(const A* z, int64_t n) {
  A m[16];
  for (int k = 0; k < 16; ++k) m[k] = -std::numeric_limits<A>::infinity();
  int64_t j = 0;
  for (; j + 16 <= n; j += 16)
    // omp simd: without it gcc keeps the 16 lanes in 16 scalar registers (one vmaxss per element).
#pragma omp simd
    for (int k = 0; k < 16; ++k) m[k] = z[j + k] > m[k] ? z[j + k] : m[k];
  for (; j < n; ++j) m[0] = z[j] > m[0] ? z[j] : m[0];
  // The lanes pairwise (4 dependent steps, not 15): a maximum does not depend on the order. NaN never
  // gets in (z > m is false for it); only the sign of a zero maximum could differ, and exp(z - m) is
  // the same for either.
  // Unrolled, so that m stays in registers (a loop over it went through the stack, with stalled
  // store-to-load forwarding).
#pragma GCC unroll 4
  for (int w = 8; w > 0; w /= 2)
#pragma GCC unroll 8
    for (int k = 0; k < w; ++k) m[k] = m[k + w] > m[k] ? m[k + w] : m[k];
  return m[0];
}

// sum_j fac[j] * dout[j] * y[j] (fac == nullptr: no dropout).
template <typename A>
inline A row_dot3(const A* fac, const A* dout, const A* y, int64_t n) {
  A s[16] = {};
  int64_t j = 0;
  if (fac) {
    for (; j + 16 <= n; j += 16)
      for (int k = 0; k < 16; ++k) s[k] += fac[j + k] * dout[j + k] * y[j + k];
    for (; j < n; ++j) s[0] += fac[j] * dout[j] * y[j];
  } else {
    for (; j + 16 <= n; j += 16)
      for (int k = 0; k < 16; ++k) s[k] += dout[j + k] * y[j + k];
    for (; j < n; ++j) s[0] += dout[j] * y[j];
  }
  A r = 0;
  for (int k = 0; k < 16; ++k) r += s[k];
  return r;
}

// ---- Row kernels on acc_t rows (A = float: multi-versioned; A = double: gradcheck only) ----

// z[j] = sc * s[j], or -inf where pad[j] (pad may be nullptr); returns max_j z[j] (-inf for n == 0).
template <typename A>
inline A scale_mask_row_t(const A* s, const uint8_t* pad, A sc, A* z, int64_t n) {
  const A ninf = -std::numeric_limits<A>::infinity();
  if (pad) {
    // omp simd: pad is bytes, which may alias z (and see no-trapping-math at the top).
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) z[j] = pad[j] ? ninf : sc * s[j];
  } else {
    for (int64_t j = 0; j < n; ++j) z[j] = sc * s[j];
  }
  return row_max(z, n);
}
FLS_CPU_CLONES float scale_mask_row(const float* s, const uint8_t* pad, float sc, float* z, int64_t n) {
  return scale_mask_row_t(s, pad, sc, z, n);
}
double scale_mask_row(const double* s, const uint8_t* pad, double sc, double* z, int64_t n) {
  return scale_mask_row_t(s, pad, sc, z, n);
}

// In place z -> exp(z - m) (0 where z == -inf; m = the row's max), and the 16 lane sums of the row: element j adds to
// lane j % 16, those of the last partial 16 to lane 0, each lane in element order; lane l goes to
// acc[l * stride]. All lanes are 0 when every entry is -inf. The row's sum is then lane 0 + ... +
// lane 15 in that order (lane_sums): a 16-step dependent chain per row, which lane_sums runs for
// many rows side by side instead of one row after the other.
// float: fls::exp_nonpos_f32 (fls/fast_math.h), which vectorises and gives exactly 0 for -inf;
// float64 (gradcheck only): std::exp.
FLS_CPU_CLONES void exp_row(float* z, int64_t n, float m, float* acc, int64_t stride) {
  float a[16] = {};
  if (m != -std::numeric_limits<float>::infinity()) {
    int64_t j = 0;
    for (; j + 16 <= n; j += 16)
      for (int k = 0; k < 16; ++k) {
        z[j + k] = exp_nonpos_f32(z[j + k] - m);
        a[k] += z[j + k];
      }
    if (j < n) {
      // The last partial 16 also in one vector (exp is ~40 dependent operations per element): padded
      // with -inf (exp 0), then added to lane 0 in element order.
      float t[16];
      for (int k = 0; k < 16; ++k) t[k] = j + k < n ? z[j + k] - m : -std::numeric_limits<float>::infinity();
      for (int k = 0; k < 16; ++k) t[k] = exp_nonpos_f32(t[k]);
      for (int k = 0; j < n; ++j, ++k) {
        z[j] = t[k];
        a[0] += z[j];
      }
    }
  }
  for (int k = 0; k < 16; ++k) acc[k * stride] = a[k];
}
void exp_row(double* z, int64_t n, double m, double* acc, int64_t stride) {
  double a[16] = {};
  if (m != -std::numeric_limits<double>::infinity()) {
    for (int64_t j = 0; j < n; ++j) z[j] = std::exp(z[j] - m);
    int64_t j = 0;
    for (; j + 16 <= n; j += 16)
      for (int k = 0; k < 16; ++k) a[k] += z[j + k];
    for (; j < n; ++j) a[0] += z[j];
  }
  for (int k = 0; k < 16; ++k) acc[k * stride] = a[k];
}

// sums[r] = 0 + acc[0 * stride + r] + ... + acc[15 * stride + r], added in that order, r < rows: one
// vector lane per row.
template <typename A>
void lane_sums(const A* acc, int64_t stride, int64_t rows, A* sums) {
  std::fill(sums, sums + rows, A(0));
  for (int l = 0; l < 16; ++l)
    for (int64_t r = 0; r < rows; ++r) sums[r] += acc[l * stride + r];
}

// y[j] = e[j] * inv; out[j] = y[j] * fac[j] when fac (dropout) is given.
template <typename A>
inline void write_row_t(const A* e, A inv, const A* fac, A* y, A* out, int64_t n) {
  for (int64_t j = 0; j < n; ++j) y[j] = e[j] * inv;
  if (fac)
    for (int64_t j = 0; j < n; ++j) out[j] = e[j] * inv * fac[j];
}
FLS_CPU_CLONES void write_row(const float* e, float inv, const float* fac, float* y, float* out, int64_t n) {
  write_row_t(e, inv, fac, y, out, n);
}
void write_row(const double* e, double inv, const double* fac, double* y, double* out, int64_t n) {
  write_row_t(e, inv, fac, y, out, n);
}

// ds[j] = sc * y[j] * (g[j] - sum_k g[k] y[k]), g = fac * dout (fac == nullptr: no dropout).
template <typename A>
inline void bwd_row_t(const A* dout, const A* y, const A* fac, A sc, A* ds, int64_t n) {
  const A dot = row_dot3(fac, dout, y, n);
  if (fac) {
    for (int64_t j = 0; j < n; ++j) ds[j] = sc * y[j] * (fac[j] * dout[j] - dot);
  } else {
    for (int64_t j = 0; j < n; ++j) ds[j] = sc * y[j] * (dout[j] - dot);
  }
}
FLS_CPU_CLONES void bwd_row(const float* dout, const float* y, const float* fac, float sc, float* ds, int64_t n) {
  bwd_row_t(dout, y, fac, sc, ds, n);
}
void bwd_row(const double* dout, const double* y, const double* fac, double sc, double* ds, int64_t n) {
  bwd_row_t(dout, y, fac, sc, ds, n);
}

// out[j] = y[j] * fac[j].
FLS_CPU_CLONES void mul_row(const float* y, const float* fac, float* out, int64_t n) {
  for (int64_t j = 0; j < n; ++j) out[j] = y[j] * fac[j];
}
void mul_row(const double* y, const double* fac, double* out, int64_t n) {
  for (int64_t j = 0; j < n; ++j) out[j] = y[j] * fac[j];
}

// Rows per parallel chunk (cpu_common.h's grain_for: small calls, as decoding's, stay on one thread).
int64_t row_grain(int64_t cols) { return grain_for(cols); }

// bfloat16 <-> float for whole rows, branch-free so they vectorise (c10::BFloat16's scalar
// conversions do not): bf16 is the high half of a float; rounding is to nearest even, NaN stays NaN,
// as c10's.
FLS_CPU_CLONES void bf16_to_float(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    const uint32_t bits = static_cast<uint32_t>(src[j]) << 16;
    std::memcpy(dst + j, &bits, sizeof(float));
  }
}
FLS_CPU_CLONES void float_to_bf16(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    uint32_t u;
    std::memcpy(&u, src + j, sizeof(float));
    const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    dst[j] = static_cast<uint16_t>(src[j] != src[j] ? 0x7FC0u : rounded);
  }
}

// A row of T as acc_t<T>: the row itself when T is the math type, else converted into buf.
template <typename T>
const acc_t<T>* load_row(const T* src, acc_t<T>* buf, int64_t n) {
  if constexpr (std::is_same<T, acc_t<T>>::value) {
    return src;
  } else {
    static_assert(std::is_same<T, c10::BFloat16>::value && sizeof(T) == 2, "bf16 is the only converted type");
    bf16_to_float(reinterpret_cast<const uint16_t*>(src), buf, n);
    return buf;
  }
}
// Where to compute a row destined for dst: dst itself when T is the math type, else buf.
template <typename T>
acc_t<T>* row_target(T* dst, acc_t<T>* buf) {
  if constexpr (std::is_same<T, acc_t<T>>::value) return dst; else return buf;
}
template <typename T>
void store_row(const acc_t<T>* buf, T* dst, int64_t n) {
  if constexpr (!std::is_same<T, acc_t<T>>::value) float_to_bf16(buf, reinterpret_cast<uint16_t*>(dst), n);
}

// Rows per block of the row loops: about 4096 scores, at least one row.
int64_t block_rows(int64_t Tk) { return std::max<int64_t>(1, 4096 / std::max<int64_t>(1, Tk)); }

// fac[k * Tk + j] = dropout factor of key j of row r0 + k, k < nb, j < (lims ? lims[k] : Tk). Rows that
// follow each other in the stream (the default coordinates) are drawn at once: drawn row by row, a
// short row pays a whole Philox batch (64 words) for its few keys. Causal rows (lims) need only their
// first keys and are drawn row by row, like rows of other coordinates (a shard's).
template <typename A>
void block_factors(const DropoutParams& d, const AttentionCoords& coords, int64_t r0, int64_t nb, int64_t Tk,
                   const int64_t* lims, uint32_t* u, A* fac) {
  const uint64_t s0 = attention_row_stream(coords, r0);
  bool contiguous = lims == nullptr;
  for (int64_t k = 1; contiguous && k < nb; ++k)
    contiguous = attention_row_stream(coords, r0 + k) == s0 + static_cast<uint64_t>(k * Tk);
  if (contiguous) {
    dropout_factors(d.offset + s0, nb * Tk, d, u, fac);
    return;
  }
  for (int64_t k = 0; k < nb; ++k)
    dropout_factors(d.offset + attention_row_stream(coords, r0 + k), lims ? lims[k] : Tk, d, u, fac + k * Tk);
}

template <typename T>
void softmax_fwd_typed(const T* scores, const bool* key_padding_mask, T* y, T* out, int64_t B, int64_t H,
                           int64_t Tq, int64_t Tk, bool causal, double scale, const DropoutParams& d,
                           const AttentionCoords& coords) {
  using A = acc_t<T>;
  const int64_t rows = B * H * Tq;
  if (rows == 0 || Tk == 0) return;
  const bool drop = d.threshold != 0;
  const A sc = static_cast<A>(scale);
  const int64_t block = block_rows(Tk);
  parallel_for(rows, row_grain(Tk), [&](int64_t begin, int64_t end) {
    // Per block of rows, one loop per step: every row's scaled scores and max, their exps and lane
    // sums, the rows' sums (lane_sums), the block's dropout factors, then the outputs. Each step of a
    // short row is a dependent chain (max, exp, 16 lanes); in a loop of their own, the chains of
    // several rows run at once.
    std::vector<A> z(block * Tk), maxes(block), acc(16 * block), sums(block), sbuf(Tk), ybuf(Tk), obuf(Tk),
        fac(drop ? block * Tk : 0);
    std::vector<int64_t> lims(block);
    std::vector<uint32_t> u(drop ? dropout_words(block * Tk) : 0);
    for (int64_t r0 = begin; r0 < end; r0 += block) {
      const int64_t nb = std::min(block, end - r0);
      for (int64_t k = 0; k < nb; ++k) {
        const int64_t r = r0 + k, b = r / (H * Tq), i = r % Tq;
        // Keys j < lim survive the causal mask; the padding mask is applied on top. Keys j >= lim are
        // not computed at all (zeros).
        lims[k] = causal ? std::clamp<int64_t>(i + (Tk - Tq) + 1, 0, Tk) : Tk;
        // Read as bytes: loops over bool loads do not vectorise.
        const uint8_t* pad =
            key_padding_mask ? reinterpret_cast<const uint8_t*>(key_padding_mask) + b * Tk : nullptr;
        maxes[k] = scale_mask_row(load_row(scores + r * Tk, sbuf.data(), lims[k]), pad, sc, z.data() + k * Tk,
                                  lims[k]);
      }
      for (int64_t k = 0; k < nb; ++k) exp_row(z.data() + k * Tk, lims[k], maxes[k], acc.data() + k, block);
      lane_sums(acc.data(), block, nb, sums.data());
      if (drop) block_factors(d, coords, r0, nb, Tk, causal ? lims.data() : nullptr, u.data(), fac.data());
      for (int64_t k = 0; k < nb; ++k) {
        const int64_t r = r0 + k, lim = lims[k];
        T* yr = y + r * Tk;
        T* outr = drop ? out + r * Tk : nullptr;
        if (sums[k] == A(0)) {  // every key masked (or lim == 0): zeros, not 0/0
          std::fill(yr, yr + Tk, T(0));
          if (drop) std::fill(outr, outr + Tk, T(0));
          continue;
        }
        A* yw = row_target(yr, ybuf.data());
        A* ow = drop ? row_target(outr, obuf.data()) : nullptr;
        write_row(z.data() + k * Tk, A(1) / sums[k], drop ? fac.data() + k * Tk : nullptr, yw, ow, lim);
        store_row<T>(yw, yr, lim);
        std::fill(yr + lim, yr + Tk, T(0));
        if (drop) {
          store_row<T>(ow, outr, lim);
          std::fill(outr + lim, outr + Tk, T(0));
        }
      }
    }
  });
}

template <typename T>
void softmax_bwd_typed(const T* dout, const T* y, T* dscores, int64_t rows, int64_t Tk, double scale,
                           const DropoutParams& d, const AttentionCoords& coords) {
  using A = acc_t<T>;
  if (rows == 0 || Tk == 0) return;
  const bool drop = d.threshold != 0;
  const A sc = static_cast<A>(scale);
  const int64_t block = drop ? block_rows(Tk) : 1;
  parallel_for(rows, row_grain(Tk), [&](int64_t begin, int64_t end) {
    std::vector<A> gbuf(Tk), ybuf(Tk), dbuf(Tk), fac(drop ? block * Tk : 0);
    std::vector<uint32_t> u(drop ? dropout_words(block * Tk) : 0);
    for (int64_t r0 = begin; r0 < end; r0 += block) {
      const int64_t nb = std::min(block, end - r0);
      // The dropout mask is regenerated from (seed, offset + the row's stream start), not stored.
      if (drop) block_factors(d, coords, r0, nb, Tk, nullptr, u.data(), fac.data());
      for (int64_t r = r0; r < r0 + nb; ++r) {
        A* dw = row_target(dscores + r * Tk, dbuf.data());
        bwd_row(load_row(dout + r * Tk, gbuf.data(), Tk), load_row(y + r * Tk, ybuf.data(), Tk),
                drop ? fac.data() + (r - r0) * Tk : nullptr, sc, dw, Tk);
        store_row<T>(dw, dscores + r * Tk, Tk);
      }
    }
  });
}

// out = y * fac row by row, the factors drawn per block of rows as the forward drew them.
template <typename T>
void dropout_rows_typed(const T* y, T* out, int64_t rows, int64_t Tk, const DropoutParams& d,
                        const AttentionCoords& coords) {
  using A = acc_t<T>;
  if (rows == 0 || Tk == 0) return;
  const int64_t block = block_rows(Tk);
  parallel_for(rows, row_grain(Tk), [&](int64_t begin, int64_t end) {
    std::vector<A> ybuf(Tk), obuf(Tk), fac(block * Tk);
    std::vector<uint32_t> u(dropout_words(block * Tk));
    for (int64_t r0 = begin; r0 < end; r0 += block) {
      const int64_t nb = std::min(block, end - r0);
      block_factors(d, coords, r0, nb, Tk, nullptr, u.data(), fac.data());
      for (int64_t r = r0; r < r0 + nb; ++r) {
        const A* yr = load_row(y + r * Tk, ybuf.data(), Tk);
        A* ow = row_target(out + r * Tk, obuf.data());
        mul_row(yr, fac.data() + (r - r0) * Tk, ow, Tk);
        store_row<T>(ow, out + r * Tk, Tk);
      }
    }
  });
}

// Both permutations walk token rows (t, b) in b-major order (b outer, t inner): the token-major
// side is one contiguous row of nparts*E per step and the head-major side is nparts*H streams that
// each advance by hd per step, which the prefetchers follow. (t-major order jumps between B*H
// blocks every row; walking (b, h) blocks strides a page per hd-run on the token side.)
template <typename T>
void split_heads(const T* x, int64_t row_stride, const T* bias, T* const* out, int nparts, int64_t Tlen,
                 int64_t B, int64_t H, int64_t hd) {
  using A = acc_t<T>;
  const int64_t E = H * hd;
  parallel_for(Tlen * B, row_grain(nparts * E), [&](int64_t begin, int64_t end) {
    for (int64_t bt = begin; bt < end; ++bt) {
      const int64_t b = bt / Tlen, t = bt % Tlen;
      const T* src = x + (t * B + b) * row_stride;
      for (int p = 0; p < nparts; ++p) {
        for (int64_t h = 0; h < H; ++h) {
          const int64_t c0 = p * E + h * hd;
          const T* sr = src + c0;
          const T* bs = bias + c0;
          T* dr = out[p] + ((b * H + h) * Tlen + t) * hd;
          for (int64_t c = 0; c < hd; ++c) dr[c] = static_cast<T>(static_cast<A>(sr[c]) + static_cast<A>(bs[c]));
        }
      }
    }
  });
}

template <typename T>
void merge_heads(const T* const* in, int nparts, T* y, int64_t row_stride, int64_t Tlen, int64_t B, int64_t H,
                 int64_t hd) {
  const int64_t E = H * hd;
  parallel_for(Tlen * B, row_grain(nparts * E), [&](int64_t begin, int64_t end) {
    for (int64_t tb = begin; tb < end; ++tb) {
      const int64_t t = tb / B, b = tb % B;
      T* dst = y + tb * row_stride;
      for (int p = 0; p < nparts; ++p) {
        for (int64_t h = 0; h < H; ++h) {
          const T* sr = in[p] + ((b * H + h) * Tlen + t) * hd;
          std::memcpy(dst + p * E + h * hd, sr, hd * sizeof(T));
        }
      }
    }
  });
}

}  // namespace

void attention_softmax_fwd(const AttentionSoftmaxFwdParams& p) {
  FLS_CPU_DISPATCH(p.dtype, softmax_fwd_typed<scalar_t>(static_cast<const scalar_t*>(p.scores), p.key_padding_mask,
                                                        static_cast<scalar_t*>(p.y), static_cast<scalar_t*>(p.out),
                                                        p.B, p.H, p.Tq, p.Tk, p.causal, p.scale, p.drop,
                                                        p.coords));
}

void attention_softmax_bwd(const AttentionSoftmaxBwdParams& p) {
  FLS_CPU_DISPATCH(p.dtype, softmax_bwd_typed<scalar_t>(static_cast<const scalar_t*>(p.dout),
                                                        static_cast<const scalar_t*>(p.y),
                                                        static_cast<scalar_t*>(p.dscores), p.rows, p.Tk, p.scale,
                                                        p.drop, p.coords));
}

void attention_dropout(const AttentionDropoutParams& p) {
  if (p.drop.threshold == 0) return;  // the op layer returns y itself
  FLS_CPU_DISPATCH(p.dtype, dropout_rows_typed<scalar_t>(static_cast<const scalar_t*>(p.y),
                                                         static_cast<scalar_t*>(p.out), p.rows, p.Tk, p.drop,
                                                         p.coords));
}

void qkv_bias_split(const QkvBiasSplitParams& p) {
  const int64_t E = p.H * p.head_dim;
  FLS_CPU_DISPATCH(p.dtype, using U = scalar_t;
                   U* outs[3] = {static_cast<U*>(p.q), static_cast<U*>(p.k), static_cast<U*>(p.v)};
                   split_heads<U>(static_cast<const U*>(p.qkv), 3 * E, static_cast<const U*>(p.bias), outs, 3, p.T,
                                  p.B, p.H, p.head_dim));
}

void qkv_bias_split_bwd(const QkvBiasSplitBwdParams& p) {
  const int64_t E = p.H * p.head_dim;
  FLS_CPU_DISPATCH(p.dtype, using U = scalar_t;
                   const U* ins[3] = {static_cast<const U*>(p.dq), static_cast<const U*>(p.dk),
                                      static_cast<const U*>(p.dv)};
                   merge_heads<U>(ins, 3, static_cast<U*>(p.dqkv), 3 * E, p.T, p.B, p.H, p.head_dim);
                   column_sum(static_cast<const U*>(p.dqkv), static_cast<U*>(p.dbias), p.T * p.B, 3 * E));
}

}  // namespace cpu
}  // namespace fls
