#include "embedding.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "fls/philox.h"

namespace fls {
namespace cpu {
namespace {

// factor[c] = mult * (keep(c) ? 1/(1-p) : 0) for the elements row*dim .. row*dim+dim-1 of the draw:
// one Philox block per 4 stream elements (the row's first and last block may be shared with the
// neighbouring rows, which is why rows do not simply split the stream).
template <typename A>
void row_factors(int64_t row, int64_t dim, A mult, const DropoutParams& d, A* factor) {
  const uint64_t s0 = d.offset + static_cast<uint64_t>(row) * static_cast<uint64_t>(dim);
  const uint64_t s1 = s0 + static_cast<uint64_t>(dim);
  const A kept = static_cast<A>(d.scale) * mult;
  for (uint64_t g = s0 >> 2; (g << 2) < s1; ++g) {
    const uint32_t bits = dropout_keep4(g, d);
    for (uint64_t k = 0; k < 4; ++k) {
      const uint64_t s = (g << 2) + k;
      if (s >= s0 && s < s1) factor[s - s0] = ((bits >> k) & 1u) ? kept : A(0);
    }
  }
}

}  // namespace

template <typename T>
void embedding_fwd(const int64_t* tokens, const int64_t* positions, const T* weight, const T* pos_weight, T* out,
                   int64_t n, int64_t dim, int64_t padding_idx, double scale, const DropoutParams& d) {
  using A = acc_t<T>;
  const A sc = static_cast<A>(scale);
  const bool drop = d.threshold != 0;
  // Rows are independent; a few rows per task keep the Philox/gather work balanced.
  parallel_for(n, std::max<int64_t>(1, 4096 / std::max<int64_t>(dim, 1)), [&](int64_t begin, int64_t end) {
    std::vector<A> factor(drop ? dim : 0);
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
        row_factors<A>(r, dim, A(1), d, factor.data());
        const A* f = factor.data();
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
  (void)num_rows;
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
  const A m = static_cast<A>(mult);
  const bool drop = d.threshold != 0;
  // Groups are disjoint output rows: no two threads write the same row.
  parallel_for(nseg, std::max<int64_t>(1, 2048 / std::max<int64_t>(dim, 1)), [&](int64_t begin, int64_t end) {
    std::vector<A> acc(dim), factor(drop ? dim : 0);
    for (int64_t s = begin; s < end; ++s) {
      std::fill(acc.begin(), acc.end(), A(0));
      A* a = acc.data();
      for (int64_t i = seg[s]; i < seg[s + 1]; ++i) {
        const int64_t r = rows[i];
        const T* g = grad + r * dim;
        if (drop) {
          row_factors<A>(r, dim, m, d, factor.data());
          const A* f = factor.data();
          for (int64_t c = 0; c < dim; ++c) a[c] += static_cast<A>(g[c]) * f[c];
        } else {
          for (int64_t c = 0; c < dim; ++c) a[c] += static_cast<A>(g[c]) * m;
        }
      }
      T* o = out + keys[rows[seg[s]]] * dim;
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
