// Embedding on CPU: forward row by row (gather, scale, add position, dropout factors from Philox, at the rows of
// the row map when there is one); backward
// groups rows by a stable sort of their keys and sums each group in row order (deterministic, no atomics).
#include "../kernels/embedding.h"

#include <algorithm>
#include <vector>

#include "cpu_common.h"
#include "philox_batch.h"

namespace fls {
namespace cpu {
namespace {

// Per-thread scratch of the dropout factors of one row.
template <typename A>
struct RowDropout {
  std::vector<A> factor;  // [dim]
  std::vector<uint32_t> words;  // Philox words of the row (philox_batch.h)
  RowDropout(bool drop, int64_t dim) : factor(drop ? dim : 0), words(drop ? dropout_words(dim) : 0) {}

  // factor[c] = mult * (keep(c) ? 1/(1-p) : 0) for the elements row*dim .. row*dim+dim-1 of the draw
  // (row_map[row]*dim ... with a row map): one Philox block per 4 stream elements (a row's first and last
  // blocks may be shared with the neighbouring rows, so rows do not split the stream into whole blocks).
  const A* compute(int64_t row, int64_t dim, A mult, const DropoutParams& d, const int64_t* row_map) {
    dropout_select<A>(row_stream_start(d, row_map, row, dim), dim, d, words.data(), static_cast<A>(d.scale) * mult,
                      A(0), factor.data());
    return factor.data();
  }
};

template <typename T>
void fwd_typed(const int64_t* tokens, const int64_t* positions, const T* weight, const T* pos_weight, T* out,
                   int64_t n, int64_t dim, int64_t padding_idx, double scale, const DropoutParams& d,
                   const int64_t* row_map) {
  using A = acc_t<T>;
  const A sc = static_cast<A>(scale);
  const bool drop = d.threshold != 0;
  // Rows are independent. Their dropout factors are consecutive stream elements, drawn for `block` rows
  // at once: row by row, a short row pays a whole Philox batch (philox_batch.h) for its few groups.
  // A task gets at least a block and grain_for's elements (small calls stay on one thread). Mapped rows
  // are not consecutive in the stream: one row per draw.
  const int64_t block = row_map != nullptr ? 1 : std::max<int64_t>(1, 4096 / std::max<int64_t>(dim, 1));
  parallel_for(n, std::max(block, grain_for(dim)), [&](int64_t begin, int64_t end) {
    std::vector<A> factors(drop ? block * dim : 0);
    std::vector<uint32_t> words(drop ? dropout_words(block * dim) : 0);
    for (int64_t r = begin; r < end; ++r) {
      if (drop && (r - begin) % block == 0) {
        const int64_t rows = std::min(block, end - r);
        dropout_select<A>(row_stream_start(d, row_map, r, dim), rows * dim, d, words.data(),
                          static_cast<A>(d.scale), A(0), factors.data());
      }
      T* o = out + r * dim;
      const int64_t tok = tokens[r];
      if (tok == padding_idx) {
        std::fill(o, o + dim, static_cast<T>(0));
        continue;
      }
      const T* w = weight + tok * dim;
      // Same order of operations as the reference: (scale * w + p), then * keep * 1/(1-p).
      if (drop) {
        const A* f = factors.data() + ((r - begin) % block) * dim;
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
void table_grad_typed(const T* grad, const int64_t* keys, const int64_t* tokens, T* out, int64_t n, int64_t dim,
                   int64_t num_rows, int64_t padding_idx, double mult, const DropoutParams& d,
                   const int64_t* row_map) {
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
  parallel_for(num_rows, grain_for(dim), [&](int64_t begin, int64_t end) {
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
          const A* f = rd.compute(r, dim, m, d, row_map);
          for (int64_t c = 0; c < dim; ++c) a[c] += static_cast<A>(g[c]) * f[c];
        } else {
          for (int64_t c = 0; c < dim; ++c) a[c] += static_cast<A>(g[c]) * m;
        }
      }
      for (int64_t c = 0; c < dim; ++c) o[c] = static_cast<T>(a[c]);
    }
  });
}

}  // namespace

void embedding_fwd(const EmbeddingFwdParams& p) {
  FLS_CPU_DISPATCH(p.dtype, fwd_typed<scalar_t>(p.tokens, p.positions, static_cast<const scalar_t*>(p.weight),
                                                static_cast<const scalar_t*>(p.pos_weight),
                                                static_cast<scalar_t*>(p.out), p.n, p.dim, p.padding_idx, p.scale,
                                                p.drop, p.row_map));
}

void embedding_table_grad(const EmbeddingTableGradParams& p) {
  FLS_CPU_DISPATCH(p.dtype, table_grad_typed<scalar_t>(static_cast<const scalar_t*>(p.grad), p.keys, p.tokens,
                                                       static_cast<scalar_t*>(p.out), p.n, p.dim, p.num_rows,
                                                       p.padding_idx, p.mult, p.drop, p.row_map));
}

}  // namespace cpu
}  // namespace fls
