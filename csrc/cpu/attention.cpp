#include "attention.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <vector>

#include "fls/philox.h"

namespace fls {
namespace cpu {
namespace {

// exp(x) for x <= 0 in float: Cephes' expf (range reduction by ln2 split in two, degree-6
// polynomial, about 1 ulp). Branch-free so that the row loops vectorise (std::exp does not without
// -ffast-math); results below e^-87 flush to ~1e-38 instead of denormals, far below fp32 tolerance.
inline float exp_nonpos(float x) {
  x = x < -87.0f ? -87.0f : x;
  const float magic = 12582912.0f;  // 1.5 * 2^23: adding then subtracting it rounds to an integer
  const float n = (x * 1.44269504088896341f + magic) - magic;
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const float two_n = std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);  // n in [-126, 0]
  return p * two_n;
}
inline double exp_nonpos(double x) { return std::exp(x); }  // float64 exists for gradcheck only

// u[k] = word k % 4 of philox4x32_10(group g0 + k / 4) for k < 4 * n: the stream words of 4n
// consecutive elements. Written as lane loops over kW groups so the 32x32->64 multiplies vectorise;
// the words equal fls::philox4x32_10's (philox.h) bit for bit.
void philox_words(uint64_t g0, int64_t n, uint64_t seed, uint32_t* u) {
  constexpr int kW = 16;
  for (int64_t base = 0; base < n; base += kW) {
    uint32_t c0[kW], c1[kW], c2[kW], c3[kW];
    for (int i = 0; i < kW; ++i) {
      const uint64_t g = g0 + static_cast<uint64_t>(base + i);
      c0[i] = static_cast<uint32_t>(g);
      c1[i] = static_cast<uint32_t>(g >> 32);
      c2[i] = 0;
      c3[i] = 0;
    }
    uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
    for (int r = 0; r < 10; ++r) {
      if (r > 0) {
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
      }
      for (int i = 0; i < kW; ++i) {
        const uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * c0[i];
        const uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * c2[i];
        const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1[i] ^ k0;
        const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3[i] ^ k1;
        c0[i] = n0;
        c1[i] = static_cast<uint32_t>(p1);
        c2[i] = n2;
        c3[i] = static_cast<uint32_t>(p0);
      }
    }
    const int m = static_cast<int>(std::min<int64_t>(kW, n - base));
    for (int i = 0; i < m; ++i) {
      uint32_t* w = u + 4 * (base + i);
      w[0] = c0[i];
      w[1] = c1[i];
      w[2] = c2[i];
      w[3] = c3[i];
    }
  }
}

// fac[j] = dropout multiplier (1/(1-p) or 0) of stream element s0 + j, j < n. `u` holds >= n + 8 words.
template <typename A>
void dropout_factors(uint64_t s0, int64_t n, const DropoutParams& d, uint32_t* u, A* fac) {
  const uint64_t g0 = s0 >> 2;
  const int64_t lane0 = static_cast<int64_t>(s0 & 3);
  philox_words(g0, (lane0 + n + 3) / 4, d.seed, u);
  const A keep_scale = static_cast<A>(d.scale);
  const uint32_t thr = d.threshold;
  for (int64_t j = 0; j < n; ++j) fac[j] = (u[lane0 + j] >> 8) >= thr ? keep_scale : A(0);
}

// Reductions with 8 independent accumulators: a fixed order (deterministic) that still pipelines.
template <typename A>
A row_max(const A* z, int64_t n) {
  A m[8];
  for (int k = 0; k < 8; ++k) m[k] = -std::numeric_limits<A>::infinity();
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int k = 0; k < 8; ++k) m[k] = z[j + k] > m[k] ? z[j + k] : m[k];
  for (; j < n; ++j) m[0] = z[j] > m[0] ? z[j] : m[0];
  A r = m[0];
  for (int k = 1; k < 8; ++k) r = m[k] > r ? m[k] : r;
  return r;
}

template <typename A>
A row_dot(const A* a, const A* b, int64_t n) {
  A s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int k = 0; k < 8; ++k) s[k] += a[j + k] * b[j + k];
  for (; j < n; ++j) s[0] += a[j] * b[j];
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

template <typename A>
A row_sum(const A* a, int64_t n) {
  A s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int k = 0; k < 8; ++k) s[k] += a[j + k];
  for (; j < n; ++j) s[0] += a[j];
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

// Rows per parallel chunk: about 16k elements of work, at least one row.
int64_t row_grain(int64_t cols) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(1, cols)); }

}  // namespace

template <typename T>
void attention_softmax_fwd(const T* scores, const bool* key_padding_mask, T* y, T* out, int64_t B, int64_t H,
                           int64_t Tq, int64_t Tk, bool causal, double scale, const DropoutParams& d) {
  using A = acc_t<T>;
  const int64_t rows = B * H * Tq;
  if (rows == 0 || Tk == 0) return;
  const bool drop = d.threshold != 0;
  const A sc = static_cast<A>(scale);
  const A ninf = -std::numeric_limits<A>::infinity();
  parallel_for(rows, row_grain(Tk), [&](int64_t begin, int64_t end) {
    std::vector<A> z(Tk), fac(drop ? Tk : 0);
    std::vector<uint32_t> u(drop ? Tk + 8 : 0);
    for (int64_t r = begin; r < end; ++r) {
      const int64_t b = r / (H * Tq), i = r % Tq;
      const T* s = scores + r * Tk;
      // Keys j < lim survive the causal mask; the padding mask is applied on top.
      const int64_t lim = causal ? std::clamp<int64_t>(i + (Tk - Tq) + 1, 0, Tk) : Tk;
      const bool* pad = key_padding_mask ? key_padding_mask + b * Tk : nullptr;
      if (pad) {
        for (int64_t j = 0; j < lim; ++j) z[j] = pad[j] ? ninf : sc * static_cast<A>(s[j]);
      } else {
        for (int64_t j = 0; j < lim; ++j) z[j] = sc * static_cast<A>(s[j]);
      }
      const A m = row_max(z.data(), lim);
      T* yr = y + r * Tk;
      T* outr = drop ? out + r * Tk : nullptr;
      if (m == ninf) {  // every key masked (or lim == 0): zeros, not 0/0
        std::fill(yr, yr + Tk, T(0));
        if (drop) std::fill(outr, outr + Tk, T(0));
        continue;
      }
      for (int64_t j = 0; j < lim; ++j) z[j] = z[j] == ninf ? A(0) : exp_nonpos(z[j] - m);
      const A inv = A(1) / row_sum(z.data(), lim);
      for (int64_t j = 0; j < lim; ++j) yr[j] = static_cast<T>(z[j] * inv);
      std::fill(yr + lim, yr + Tk, T(0));
      if (drop) {
        dropout_factors(d.offset + static_cast<uint64_t>(r * Tk), lim, d, u.data(), fac.data());
        for (int64_t j = 0; j < lim; ++j) outr[j] = static_cast<T>(z[j] * inv * fac[j]);
        std::fill(outr + lim, outr + Tk, T(0));
      }
    }
  });
}

template <typename T>
void attention_softmax_bwd(const T* dout, const T* y, T* dscores, int64_t rows, int64_t Tk, double scale,
                           const DropoutParams& d) {
  using A = acc_t<T>;
  if (rows == 0 || Tk == 0) return;
  const bool drop = d.threshold != 0;
  const A sc = static_cast<A>(scale);
  parallel_for(rows, row_grain(Tk), [&](int64_t begin, int64_t end) {
    std::vector<A> g(Tk), yv(Tk), fac(drop ? Tk : 0);
    std::vector<uint32_t> u(drop ? Tk + 8 : 0);
    for (int64_t r = begin; r < end; ++r) {
      const T* dr = dout + r * Tk;
      const T* yr = y + r * Tk;
      // The dropout mask is regenerated from (seed, offset + flat index), not stored.
      if (drop) {
        dropout_factors(d.offset + static_cast<uint64_t>(r * Tk), Tk, d, u.data(), fac.data());
        for (int64_t j = 0; j < Tk; ++j) g[j] = fac[j] * static_cast<A>(dr[j]);
      } else {
        for (int64_t j = 0; j < Tk; ++j) g[j] = static_cast<A>(dr[j]);
      }
      for (int64_t j = 0; j < Tk; ++j) yv[j] = static_cast<A>(yr[j]);
      const A dot = row_dot(g.data(), yv.data(), Tk);
      T* ds = dscores + r * Tk;
      for (int64_t j = 0; j < Tk; ++j) ds[j] = static_cast<T>(sc * yv[j] * (g[j] - dot));
    }
  });
}

template <typename T>
void split_heads(const T* x, int64_t row_stride, const T* bias, T* const* out, int nparts, int64_t Tlen,
                 int64_t B, int64_t H, int64_t hd) {
  using A = acc_t<T>;
  const int64_t E = H * hd;
  parallel_for(Tlen * B, row_grain(nparts * E), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t t = row / B, b = row % B;
      for (int p = 0; p < nparts; ++p) {
        for (int64_t h = 0; h < H; ++h) {
          const int64_t c0 = p * E + h * hd;
          const T* src = x + row * row_stride + c0;
          T* dst = out[p] + ((b * H + h) * Tlen + t) * hd;
          if (bias) {
            const T* bs = bias + c0;
            for (int64_t c = 0; c < hd; ++c) dst[c] = static_cast<T>(static_cast<A>(src[c]) + static_cast<A>(bs[c]));
          } else {
            std::copy(src, src + hd, dst);
          }
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
    for (int64_t row = begin; row < end; ++row) {
      const int64_t t = row / B, b = row % B;
      for (int p = 0; p < nparts; ++p) {
        for (int64_t h = 0; h < H; ++h) {
          const T* src = in[p] + ((b * H + h) * Tlen + t) * hd;
          std::copy(src, src + hd, y + row * row_stride + p * E + h * hd);
        }
      }
    }
  });
}

template <typename T>
void column_sum(const T* x, T* sums, int64_t rows, int64_t cols) {
  using A = acc_t<T>;
  // Columns split across threads, each column summed over rows in order: the result does not depend
  // on the number of threads.
  parallel_for(cols, 64, [&](int64_t begin, int64_t end) {
    std::vector<A> acc(end - begin, A(0));
    for (int64_t r = 0; r < rows; ++r) {
      const T* xr = x + r * cols;
      for (int64_t c = begin; c < end; ++c) acc[c - begin] += static_cast<A>(xr[c]);
    }
    for (int64_t c = begin; c < end; ++c) sums[c] = static_cast<T>(acc[c - begin]);
  });
}

#define FLS_INSTANTIATE_ATTN(T)                                                                                 \
  template void attention_softmax_fwd<T>(const T*, const bool*, T*, T*, int64_t, int64_t, int64_t, int64_t, bool, \
                                         double, const DropoutParams&);                                        \
  template void attention_softmax_bwd<T>(const T*, const T*, T*, int64_t, int64_t, double, const DropoutParams&); \
  template void split_heads<T>(const T*, int64_t, const T*, T* const*, int, int64_t, int64_t, int64_t, int64_t);  \
  template void merge_heads<T>(const T* const*, int, T*, int64_t, int64_t, int64_t, int64_t, int64_t);            \
  template void column_sum<T>(const T*, T*, int64_t, int64_t);
FLS_CPU_INSTANTIATE(FLS_INSTANTIATE_ATTN)

}  // namespace cpu
}  // namespace fls
