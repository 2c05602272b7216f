// Embedding on CPU: forward row by row (gather, scale, add position, dropout factors from Philox); backward
// groups rows by a stable sort of their keys and sums each group in row order (deterministic, no atomics).
#include "embedding.h"

#include <algorithm>
#include <vector>

#include "fls/philox.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace fls {
namespace cpu {
namespace {

// Keep bits of the Philox blocks g0 .. g0+kLanes-1 (bits[i] = dropout_keep4(g0 + i, d)). The rounds of
// fls::philox4x32_10 (philox.h) run on 2 x 4 counters in SSE2 registers (baseline on x86-64): GCC does not
// vectorise the 32x32->64 multiplies by itself, and one scalar Philox per 4 elements costs more than the
// rest of the kernel. Other targets call the scalar generator. Bitwise equality with the reference is
// tested (tests/test_embedding.py).
constexpr int kLanes = 8;
#if defined(__SSE2__)
inline void mulhilo4(__m128i c, __m128i m, __m128i* hi, __m128i* lo) {
  const __m128i even = _mm_shuffle_epi32(_mm_mul_epu32(c, m), _MM_SHUFFLE(3, 1, 2, 0));  // lo0 lo2 hi0 hi2
  const __m128i odd = _mm_shuffle_epi32(_mm_mul_epu32(_mm_srli_epi64(c, 32), m), _MM_SHUFFLE(3, 1, 2, 0));
  *lo = _mm_unpacklo_epi32(even, odd);
  *hi = _mm_unpackhi_epi32(even, odd);
}

inline void dropout_keep4_lanes(uint64_t g0, const DropoutParams& d, uint32_t* bits) {
  __m128i c0[2], c1[2], c2[2], c3[2];
  for (int h = 0; h < 2; ++h) {
    alignas(16) uint32_t lo[4], hi[4];
    for (int i = 0; i < 4; ++i) {
      const uint64_t g = g0 + static_cast<uint64_t>(4 * h + i);
      lo[i] = static_cast<uint32_t>(g);
      hi[i] = static_cast<uint32_t>(g >> 32);
    }
    c0[h] = _mm_load_si128(reinterpret_cast<const __m128i*>(lo));
    c1[h] = _mm_load_si128(reinterpret_cast<const __m128i*>(hi));
    c2[h] = _mm_setzero_si128();
    c3[h] = _mm_setzero_si128();
  }
  const __m128i m0 = _mm_set1_epi32(static_cast<int>(0xD2511F53u)), m1 = _mm_set1_epi32(static_cast<int>(0xCD9E8D57u));
  uint32_t k0 = static_cast<uint32_t>(d.seed), k1 = static_cast<uint32_t>(d.seed >> 32);
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    const __m128i vk0 = _mm_set1_epi32(static_cast<int>(k0)), vk1 = _mm_set1_epi32(static_cast<int>(k1));
    for (int h = 0; h < 2; ++h) {
      __m128i hi0, lo0, hi1, lo1;
      mulhilo4(c0[h], m0, &hi0, &lo0);
      mulhilo4(c2[h], m1, &hi1, &lo1);
      c0[h] = _mm_xor_si128(_mm_xor_si128(hi1, c1[h]), vk0);
      c1[h] = lo1;
      c2[h] = _mm_xor_si128(_mm_xor_si128(hi0, c3[h]), vk1);
      c3[h] = lo0;
    }
  }
  // keep iff (u >> 8) >= threshold; both sides < 2^31 after the shift (threshold <= 2^24), so a signed
  // compare is exact: dropped iff threshold > (u >> 8).
  const __m128i thr = _mm_set1_epi32(static_cast<int>(d.threshold));
  for (int h = 0; h < 2; ++h) {
    const __m128i* c[4] = {&c0[h], &c1[h], &c2[h], &c3[h]};
    __m128i b = _mm_setzero_si128();
    for (int k = 0; k < 4; ++k) {
      const __m128i dropped = _mm_cmpgt_epi32(thr, _mm_srli_epi32(*c[k], 8));
      b = _mm_or_si128(b, _mm_andnot_si128(dropped, _mm_set1_epi32(1 << k)));
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(bits + 4 * h), b);
  }
}
#else
inline void dropout_keep4_lanes(uint64_t g0, const DropoutParams& d, uint32_t* bits) {
  for (int i = 0; i < kLanes; ++i) bits[i] = dropout_keep4(g0 + static_cast<uint64_t>(i), d);
}
#endif

// Per-thread scratch of the dropout factors of one row.
template <typename A>
struct RowDropout {
  std::vector<A> factor;       // factors of the row's whole blocks: [4 * blocks]
  std::vector<uint32_t> bits;  // keep bits of the row's Philox blocks, padded to whole lanes
  RowDropout(bool drop, int64_t dim) : factor(drop ? 4 * ((dim + 3) / 4 + 1) : 0), bits(drop ? (dim + 3) / 4 + 1 + kLanes : 0) {}

  // factor[c] = mult * (keep(c) ? 1/(1-p) : 0) for the elements row*dim .. row*dim+dim-1 of the draw: one
  // Philox block per 4 stream elements (a row's first and last blocks may be shared with the neighbouring
  // rows, so rows do not split the stream into whole blocks).
  const A* compute(int64_t row, int64_t dim, A mult, const DropoutParams& d) {
    const uint64_t s0 = d.offset + static_cast<uint64_t>(row) * static_cast<uint64_t>(dim);
    const uint64_t g0 = s0 >> 2, ng = ((s0 + static_cast<uint64_t>(dim) + 3) >> 2) - g0;
    for (uint64_t j = 0; j < ng; j += kLanes) dropout_keep4_lanes(g0 + j, d, bits.data() + j);
    const A kept = static_cast<A>(d.scale) * mult;
    const uint32_t* bt = bits.data();
    // Factors of whole blocks (a regular loop the compiler vectorises); the row starts s0 & 3 into it.
    A* f = factor.data();
    for (uint64_t j = 0; j < ng; ++j) {
      const uint32_t b = bt[j];
      for (int k = 0; k < 4; ++k) f[4 * j + k] = ((b >> k) & 1u) ? kept : A(0);
    }
    f += s0 & 3;
    return f;
  }
};

}  // namespace

template <typename T>
void embedding_fwd(const int64_t* tokens, const int64_t* positions, const T* weight, const T* pos_weight, T* out,
                   int64_t n, int64_t dim, int64_t padding_idx, double scale, const DropoutParams& d) {
  using A = acc_t<T>;
  const A sc = static_cast<A>(scale);
  const bool drop = d.threshold != 0;
  // Rows are independent; a few rows per task keep the Philox/gather work balanced.
  parallel_for(n, std::max<int64_t>(1, 4096 / std::max<int64_t>(dim, 1)), [&](int64_t begin, int64_t end) {
    RowDropout<A> rd(drop, dim);
    for (int64_t r = begin; r < end; ++r) {
      T* o = out + r * dim;
      const int64_t tok = tokens[r];
      if (tok == padding_idx) {
        std::fill(o, o + dim, static_cast<T>(0));
        continue;
      }
      const T* w = weight + tok * dim;
      // Same order of operations as the reference: (scale * w + p), then * keep * 1/(1-p).
      if (drop) {
        const A* f = rd.compute(r, dim, A(1), d);
        if (pos_weight != nullptr) {
          const T* p = pos_weight + positions[r] * dim;
          for (int64_t c = 0; c < dim; ++c)
            o[c] = static_cast<T>((static_cast<A>(w[c]) * sc + static_cast<A>(p[c])) * f[c]);
        } else {
          for (int64_t c = 0; c < dim; ++c) o[c] = static_cast<T>(static_cast<A>(w[c]) * sc * f[c]);
        }
      } else if (pos_weight != nullptr) {
        const T* p = pos_weight + positions[r] * dim;
        for (int64_t c = 0; c < dim; ++c) o[c] = static_cast<T>(static_cast<A>(w[c]) * sc + static_cast<A>(p[c]));
      } else {
        for (int64_t c = 0; c < dim; ++c) o[c] = static_cast<T>(static_cast<A>(w[c]) * sc);
      }
    }
  });
}

template <typename T>
void embedding_bwd(const T* grad, const int64_t* keys, const int64_t* tokens, T* out, int64_t n, int64_t dim,
                   int64_t num_rows, int64_t padding_idx, double mult, const DropoutParams& d) {
  using A = acc_t<T>;
  // Non-pad rows, stably sorted by key: equal keys stay in row order, which fixes the summation order.
  std::vector<int64_t> rows;
  rows.reserve(n);
  for (int64_t r = 0; r < n; ++r)
    if (tokens[r] != padding_idx) rows.push_back(r);
  std::stable_sort(rows.begin(), rows.end(), [&](int64_t a, int64_t b) { return keys[a] < keys[b]; });
  std::vector<int64_t> seg;  // start of each group of equal keys in `rows`, plus the end
  for (int64_t i = 0; i < static_cast<int64_t>(rows.size()); ++i)
    if (i == 0 || keys[rows[i]] != keys[rows[i - 1]]) seg.push_back(i);
  seg.push_back(static_cast<int64_t>(rows.size()));
  const int64_t nseg = static_cast<int64_t>(seg.size()) - 1;
  std::vector<int64_t> seg_of(num_rows, -1);  // output row -> its group, -1 when no key names it
  for (int64_t s = 0; s < nseg; ++s) seg_of[keys[rows[seg[s]]]] = s;
  const A m = static_cast<A>(mult);
  const bool drop = d.threshold != 0;
  // Output rows split across threads: each row written exactly once (its group's sum, or zeros), so no
  // separate zero fill and no two threads touch one row.
  parallel_for(num_rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(dim, 1)), [&](int64_t begin, int64_t end) {
    std::vector<A> acc(dim);
    RowDropout<A> rd(drop, dim);
    for (int64_t k = begin; k < end; ++k) {
      T* o = out + k * dim;
      const int64_t s = seg_of[k];
      if (s < 0) {
        std::fill(o, o + dim, static_cast<T>(0));
        continue;
      }
      std::fill(acc.begin(), acc.end(), A(0));
      A* a = acc.data();
      for (int64_t i = seg[s]; i < seg[s + 1]; ++i) {
        const int64_t r = rows[i];
        const T* g = grad + r * dim;
        if (drop) {
          const A* f = rd.compute(r, dim, m, d);
          for (int64_t c = 0; c < dim; ++c) a[c] += static_cast<A>(g[c]) * f[c];
        } else {
          for (int64_t c = 0; c < dim; ++c) a[c] += static_cast<A>(g[c]) * m;
        }
      }
      for (int64_t c = 0; c < dim; ++c) o[c] = static_cast<T>(a[c]);
    }
  });
}

#define FLS_INSTANTIATE_EMB(T)                                                                                  \
  template void embedding_fwd<T>(const int64_t*, const int64_t*, const T*, const T*, T*, int64_t, int64_t,    \
                                 int64_t, double, const DropoutParams&);                                      \
  template void embedding_bwd<T>(const T*, const int64_t*, const int64_t*, T*, int64_t, int64_t, int64_t,     \
                                 int64_t, double, const DropoutParams&);
FLS_CPU_INSTANTIATE(FLS_INSTANTIATE_EMB)

}  // namespace cpu
}  // namespace fls
