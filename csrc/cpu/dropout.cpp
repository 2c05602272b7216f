// FP ops here never raise traps we care about; without this, GCC (no -ffast-math) refuses to
// if-convert the float selects in fls/activations.h's erf/tanh and the loops stay scalar (~5x slower).
#pragma GCC optimize("no-trapping-math")
// Bias + activation + dropout (+ residual) on CPU. Both public ops of the family run through one
// forward and one backward template, specialised at compile time on the activation (identity for
// bias+dropout+residual) so the inner loops stay branch-free. With a row map (packed rows) every row
// draws its factors from its own stream start (row_stream_start).
#include "../kernels/dropout.h"

#include <algorithm>
#include <type_traits>
#include <vector>

#include "column_sum.h"
#include "cpu_common.h"
#include "philox_batch.h"

namespace fls {
namespace cpu {
namespace {

// Elements per parallel work item of the element-wise loops, and rows per fixed chunk of the
// column sums (fixed, so that dbias does not depend on the thread count).
constexpr int64_t kBlock = 4096;
constexpr int64_t kRowsPerChunk = 32;

// f[i] = multiplier of stream element s0 + i: scale or 0, or 1 when dropout is off.
// u: scratch of dropout_words(n) words (philox_batch.h).
template <typename A>
void fill_factors(A* f, uint64_t s0, int64_t n, const DropoutParams& d, uint32_t* u) {
  if (d.threshold == 0) {
    std::fill(f, f + n, A(1));
    return;
  }
  dropout_select<A>(s0, n, d, u, static_cast<A>(d.scale), A(0), f);
}

// The per-element loops. Plain templates for every type; for float (the training dtype on CPU)
// they are called through the FLS_CPU_CLONES (cpu_common.h) picked at run time.
template <typename T, Act ACT, bool RESID>
inline void seg_fwd_loop(const T* xe, const T* be, const T* re, const acc_t<T>* fe, T* ye, int64_t n) {
  using A = acc_t<T>;
  for (int64_t j = 0; j < n; ++j) {
    const A h = act_fwd<ACT, A>(static_cast<A>(xe[j]) + static_cast<A>(be[j])) * fe[j];
    if constexpr (RESID) {
      ye[j] = static_cast<T>(static_cast<A>(re[j]) + h);
    } else {
      ye[j] = static_cast<T>(h);
    }
  }
}

// dx = dy * f * act'(x + bias) for one row; s[c] += dx (before rounding to T).
template <typename T, Act ACT>
inline void row_bwd_loop(const T* dyr, const T* xr, const T* bias, const acc_t<T>* f, T* dxr, acc_t<T>* s,
                         int64_t n) {
  using A = acc_t<T>;
  for (int64_t c = 0; c < n; ++c) {
    A g = static_cast<A>(dyr[c]) * f[c];
    if constexpr (ACT != Act::kIdentity) g *= act_grad<ACT, A>(static_cast<A>(xr[c]) + static_cast<A>(bias[c]));
    dxr[c] = static_cast<T>(g);
    s[c] += g;
  }
}

#define FLS_F32_CLONES(ACT, NAME)                                                                              \
  FLS_CPU_CLONES void seg_fwd_f32_##NAME(const float* xe, const float* be, const float* re, const float* fe,   \
                                         float* ye, int64_t n) {                                               \
    seg_fwd_loop<float, ACT, false>(xe, be, re, fe, ye, n);                                                    \
  }                                                                                                            \
  FLS_CPU_CLONES void row_bwd_f32_##NAME(const float* dyr, const float* xr, const float* bias, const float* f,  \
                                         float* dxr, float* s, int64_t n) {                                    \
    row_bwd_loop<float, ACT>(dyr, xr, bias, f, dxr, s, n);                                                     \
  }
FLS_F32_CLONES(Act::kIdentity, identity)
FLS_F32_CLONES(Act::kRelu, relu)
FLS_F32_CLONES(Act::kGelu, gelu)
FLS_F32_CLONES(Act::kGeluTanh, gelu_tanh)
FLS_CPU_CLONES void seg_fwd_f32_residual(const float* xe, const float* be, const float* re, const float* fe,
                                         float* ye, int64_t n) {
  seg_fwd_loop<float, Act::kIdentity, true>(xe, be, re, fe, ye, n);
}

template <typename T, Act ACT, bool RESID>
void seg_fwd(const T* xe, const T* be, const T* re, const acc_t<T>* fe, T* ye, int64_t n) {
  if constexpr (std::is_same<T, float>::value) {
    if constexpr (RESID) return seg_fwd_f32_residual(xe, be, re, fe, ye, n);
    if constexpr (ACT == Act::kIdentity) return seg_fwd_f32_identity(xe, be, re, fe, ye, n);
    if constexpr (ACT == Act::kRelu) return seg_fwd_f32_relu(xe, be, re, fe, ye, n);
    if constexpr (ACT == Act::kGelu) return seg_fwd_f32_gelu(xe, be, re, fe, ye, n);
    if constexpr (ACT == Act::kGeluTanh) return seg_fwd_f32_gelu_tanh(xe, be, re, fe, ye, n);
  } else {
    seg_fwd_loop<T, ACT, RESID>(xe, be, re, fe, ye, n);
  }
}

template <typename T, Act ACT>
void row_bwd(const T* dyr, const T* xr, const T* bias, const acc_t<T>* f, T* dxr, acc_t<T>* s, int64_t n) {
  if constexpr (std::is_same<T, float>::value) {
    if constexpr (ACT == Act::kIdentity) return row_bwd_f32_identity(dyr, xr, bias, f, dxr, s, n);
    if constexpr (ACT == Act::kRelu) return row_bwd_f32_relu(dyr, xr, bias, f, dxr, s, n);
    if constexpr (ACT == Act::kGelu) return row_bwd_f32_gelu(dyr, xr, bias, f, dxr, s, n);
    if constexpr (ACT == Act::kGeluTanh) return row_bwd_f32_gelu_tanh(dyr, xr, bias, f, dxr, s, n);
  } else {
    row_bwd_loop<T, ACT>(dyr, xr, bias, f, dxr, s, n);
  }
}

// The forward of a row map: mapped rows are not consecutive in the stream, so a task takes whole rows
// and draws each row's factors alone.
template <typename T, Act ACT, bool RESID>
void fwd_rows_impl(const T* x, const T* bias, const T* residual, T* y, int64_t rows, int64_t cols,
                   const DropoutParams& d, const int64_t* row_map) {
  using A = acc_t<T>;
  parallel_for(rows, grain_for(cols), [&](int64_t r0, int64_t r1) {
    std::vector<A> f(cols);
    std::vector<uint32_t> u(dropout_words(cols));
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t e = r * cols;
      fill_factors(f.data(), row_stream_start(d, row_map, r, cols), cols, d, u.data());
      seg_fwd<T, ACT, RESID>(x + e, bias, RESID ? residual + e : nullptr, f.data(), y + e, cols);
    }
  });
}

template <typename T, Act ACT, bool RESID>
void fwd_impl(const T* x, const T* bias, const T* residual, T* y, int64_t rows, int64_t cols,
              const DropoutParams& d, const int64_t* row_map) {
  if (row_map != nullptr) return fwd_rows_impl<T, ACT, RESID>(x, bias, residual, y, rows, cols, d, row_map);
  using A = acc_t<T>;
  const int64_t n = rows * cols;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  parallel_for(blocks, grain_for(kBlock), [&](int64_t b0, int64_t b1) {
    std::vector<A> fbuf(kBlock);
    std::vector<uint32_t> u(dropout_words(kBlock));
    A* f = fbuf.data();
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t e0 = blk * kBlock, e1 = std::min(n, e0 + kBlock);
      fill_factors(f, d.offset + static_cast<uint64_t>(e0), e1 - e0, d, u.data());
      // Walk the block in row segments so the bias index is a contiguous run.
      int64_t c = e0 % cols;
      for (int64_t e = e0; e < e1;) {
        const int64_t seg = std::min(cols - c, e1 - e);
        seg_fwd<T, ACT, RESID>(x + e, bias + c, RESID ? residual + e : nullptr, f + (e - e0), y + e, seg);
        e += seg;
        c = 0;
      }
    }
  });
}

template <typename T, Act ACT>
void bwd_impl(const T* dy, const T* x, const T* bias, T* dx, T* dbias, int64_t rows, int64_t cols,
              const DropoutParams& d, const int64_t* row_map) {
  using A = acc_t<T>;
  const int64_t chunks = (rows + kRowsPerChunk - 1) / kRowsPerChunk;
  std::vector<A> partial(static_cast<size_t>(chunks * cols));
  // Step 1: per chunk of rows, dx and the chunk's column sums (rows in order).
  // The factors of consecutive rows are consecutive stream elements: they are drawn for up to kBlock
  // elements of rows at once (at least one row), not row by row, which would pad every short row to
  // a whole Philox batch. Mapped rows are not consecutive: one row per draw.
  const int64_t rows_per_draw = row_map != nullptr ? 1 : std::clamp<int64_t>(kBlock / cols, 1, kRowsPerChunk);
  parallel_for(chunks, grain_for(kRowsPerChunk * cols), [&](int64_t k0, int64_t k1) {
    std::vector<A> fbuf(rows_per_draw * cols);
    std::vector<uint32_t> u(dropout_words(rows_per_draw * cols));
    for (int64_t k = k0; k < k1; ++k) {
      A* s = partial.data() + k * cols;
      std::fill(s, s + cols, A(0));
      const int64_t r1 = std::min(rows, (k + 1) * kRowsPerChunk);
      for (int64_t r0 = k * kRowsPerChunk; r0 < r1; r0 += rows_per_draw) {
        const int64_t n_rows = std::min(rows_per_draw, r1 - r0);
        fill_factors(fbuf.data(), row_stream_start(d, row_map, r0, cols), n_rows * cols, d, u.data());
        for (int64_t r = r0; r < r0 + n_rows; ++r) {  // rows in order: the chunk's column sums are unchanged
          const int64_t e0 = r * cols;
          row_bwd<T, ACT>(dy + e0, ACT == Act::kIdentity ? nullptr : x + e0, bias, fbuf.data() + (r - r0) * cols,
                          dx + e0, s, cols);
        }
      }
    }
  });
  // Step 2: dbias[c] = sum of the chunk sums in chunk order.
  column_sum(partial.data(), dbias, chunks, cols);
}

template <typename T>
void fwd_typed(const T* x, const T* bias, const T* residual, T* y, int64_t rows, int64_t cols, Act act,
               const DropoutParams& d, const int64_t* row_map) {
  if (rows == 0 || cols == 0) return;
  if (residual != nullptr) {
    // bias + dropout + residual has no activation; other combinations are not needed by the model.
    fwd_impl<T, Act::kIdentity, true>(x, bias, residual, y, rows, cols, d, row_map);
    return;
  }
  switch (act) {
    case Act::kIdentity: fwd_impl<T, Act::kIdentity, false>(x, bias, nullptr, y, rows, cols, d, row_map); break;
    case Act::kRelu: fwd_impl<T, Act::kRelu, false>(x, bias, nullptr, y, rows, cols, d, row_map); break;
    case Act::kGelu: fwd_impl<T, Act::kGelu, false>(x, bias, nullptr, y, rows, cols, d, row_map); break;
    case Act::kGeluTanh: fwd_impl<T, Act::kGeluTanh, false>(x, bias, nullptr, y, rows, cols, d, row_map); break;
  }
}

template <typename T>
void bwd_typed(const T* dy, const T* x, const T* bias, T* dx, T* dbias, int64_t rows, int64_t cols, Act act,
               const DropoutParams& d, const int64_t* row_map) {
  if (cols == 0) return;
  switch (act) {
    case Act::kIdentity: bwd_impl<T, Act::kIdentity>(dy, x, bias, dx, dbias, rows, cols, d, row_map); break;
    case Act::kRelu: bwd_impl<T, Act::kRelu>(dy, x, bias, dx, dbias, rows, cols, d, row_map); break;
    case Act::kGelu: bwd_impl<T, Act::kGelu>(dy, x, bias, dx, dbias, rows, cols, d, row_map); break;
    case Act::kGeluTanh: bwd_impl<T, Act::kGeluTanh>(dy, x, bias, dx, dbias, rows, cols, d, row_map); break;
  }
}

}  // namespace

void dropout_mask(const DropoutMaskParams& p) {
  bool* keep = p.keep;
  const int64_t n = p.n;
  const DropoutParams& d = p.drop;
  if (p.row_map != nullptr) {
    const int64_t cols = p.cols;
    parallel_for(n / cols, grain_for(cols), [&](int64_t r0, int64_t r1) {
      std::vector<uint32_t> u(dropout_words(cols));
      for (int64_t r = r0; r < r1; ++r)
        dropout_select<bool>(row_stream_start(d, p.row_map, r, cols), cols, d, u.data(), true, false, keep + r * cols);
    });
    return;
  }
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  parallel_for(blocks, grain_for(kBlock), [&](int64_t b0, int64_t b1) {
    std::vector<uint32_t> u(dropout_words(kBlock));
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t e0 = blk * kBlock, e1 = std::min(n, e0 + kBlock);
      dropout_select<bool>(d.offset + static_cast<uint64_t>(e0), e1 - e0, d, u.data(), true, false, keep + e0);
    }
  });
}

void bias_act_dropout_fwd(const BiasActDropoutFwdParams& p) {
  FLS_CPU_DISPATCH(p.dtype, fwd_typed<scalar_t>(static_cast<const scalar_t*>(p.x), static_cast<const scalar_t*>(p.bias),
                                                static_cast<const scalar_t*>(p.residual), static_cast<scalar_t*>(p.y),
                                                p.rows, p.cols, p.act, p.drop, p.row_map));
}

void bias_act_dropout_bwd(const BiasActDropoutBwdParams& p) {
  FLS_CPU_DISPATCH(p.dtype, bwd_typed<scalar_t>(static_cast<const scalar_t*>(p.dy), static_cast<const scalar_t*>(p.x),
                                                static_cast<const scalar_t*>(p.bias), static_cast<scalar_t*>(p.dx),
                                                static_cast<scalar_t*>(p.dbias), p.rows, p.cols, p.act, p.drop,
                                                p.row_map));
}

}  // namespace cpu
}  // namespace fls
