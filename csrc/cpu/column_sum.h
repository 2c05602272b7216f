// The fixed-order column sum that every CPU backward with a bias-like gradient ends with (layer norm's
// dweight/dbias, dropout's dbias, the qkv split's dbias).
#pragma once
#include <algorithm>
#include <vector>

#include "cpu_common.h"

namespace fls {
namespace cpu {

// sums[c] = sum over r of x[r, c], added in row order for every column, so the result does not depend on
// the thread count; accumulated in acc_t<T> and rounded once to T. Threads split the columns.
// x: [rows, cols] S (T itself, or the acc_t<T> partial sums of fixed row chunks); sums: [cols] T.
template <typename S, typename T>
void column_sum(const S* x, T* sums, int64_t rows, int64_t cols) {
  using A = acc_t<T>;
  parallel_for(cols, std::max<int64_t>(64, grain_for(rows)), [&](int64_t begin, int64_t end) {
    std::vector<A> acc(end - begin, A(0));
    A* a = acc.data();
    for (int64_t r = 0; r < rows; ++r) {
      const S* xr = x + r * cols + begin;
      // Vectorised across columns; each column still adds its rows in order.
#pragma omp simd
      for (int64_t c = 0; c < end - begin; ++c) a[c] += static_cast<A>(xr[c]);
    }
    for (int64_t c = begin; c < end; ++c) sums[c] = static_cast<T>(a[c - begin]);
  });
}

}  // namespace cpu
}  // namespace fls
