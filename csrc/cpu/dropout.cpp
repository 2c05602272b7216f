// FP ops here never raise traps we care about; without this, GCC (no -ffast-math) refuses to
// if-convert the selects in fls/activations.h's exp/erf/tanh and the loops stay scalar (~5x slower).
#pragma GCC optimize("no-trapping-math")
// Bias + activation + dropout (+ residual) on CPU. Both public ops of the family run through one
// forward and one backward template, specialised at compile time on the activation (identity for
// bias+dropout+residual) so the inner loops stay branch-free.
#include "dropout.h"

#include <algorithm>
#include <type_traits>
#include <vector>

namespace fls {
namespace cpu {
namespace {

// Elements per parallel work item of the element-wise loops, and rows per fixed chunk of the
// column sums (fixed, so that dbias does not depend on the thread count).
constexpr int64_t kBlock = 4096;
constexpr int64_t kRowsPerChunk = 32;

// o[4j + k] = keep bit k of group g0 + j ? kv : dv, for j in [0, groups). No cross-iteration
// dependence, so the compiler vectorises the ten Philox rounds across groups; Philox is most of the
// cost of these ops, and AVX2 (4 lanes of 32x32->64-bit multiplies vs SSE2's 2) runs it about twice
// as fast, hence a runtime-dispatched AVX2 clone (the build targets baseline x86-64).
template <typename V>
inline void keep_groups(V* o, uint64_t g0, int64_t groups, uint64_t seed, uint32_t thr, V kv, V dv) {
  for (int64_t j = 0; j < groups; ++j) {
    const U32x4 u = philox4x32_10(g0 + static_cast<uint64_t>(j), seed);
    o[4 * j + 0] = (u.v[0] >> 8) >= thr ? kv : dv;
    o[4 * j + 1] = (u.v[1] >> 8) >= thr ? kv : dv;
    o[4 * j + 2] = (u.v[2] >> 8) >= thr ? kv : dv;
    o[4 * j + 3] = (u.v[3] >> 8) >= thr ? kv : dv;
  }
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define FLS_X86_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define FLS_X86_CLONES
#endif

FLS_X86_CLONES void keep_groups_f32(float* o, uint64_t g0, int64_t groups, uint64_t seed, uint32_t thr, float kv,
                                    float dv) {
  keep_groups<float>(o, g0, groups, seed, thr, kv, dv);
}
FLS_X86_CLONES void keep_groups_bool(bool* o, uint64_t g0, int64_t groups, uint64_t seed, uint32_t thr) {
  keep_groups<bool>(o, g0, groups, seed, thr, true, false);
}

template <typename V>
void keep_groups_any(V* o, uint64_t g0, int64_t groups, uint64_t seed, uint32_t thr, V kv, V dv) {
  if constexpr (std::is_same<V, float>::value) {
    keep_groups_f32(o, g0, groups, seed, thr, kv, dv);
  } else if constexpr (std::is_same<V, bool>::value) {
    keep_groups_bool(o, g0, groups, seed, thr);
  } else {
    keep_groups<V>(o, g0, groups, seed, thr, kv, dv);
  }
}

// out[i] = keep ? kv : dv for stream elements s0 .. s0+n-1: one Philox block per 4 elements.
template <typename V>
void fill_keep(V* out, uint64_t s0, int64_t n, const DropoutParams& d, V kv, V dv) {
  int64_t i = 0;
  uint64_t s = s0;
  if ((s & 3) && n > 0) {  // head: the rest of a partly used group
    const uint32_t k = dropout_keep4(s >> 2, d);
    for (; i < n && (s & 3); ++i, ++s) out[i] = ((k >> (s & 3)) & 1u) ? kv : dv;
  }
  const int64_t groups = (n - i) >> 2;
  keep_groups_any<V>(out + i, s >> 2, groups, d.seed, d.threshold, kv, dv);
  i += groups * 4;
  s += static_cast<uint64_t>(groups) * 4;
  if (i < n) {  // tail: the start of a group
    const uint32_t k = dropout_keep4(s >> 2, d);
    for (; i < n; ++i, ++s) out[i] = ((k >> (s & 3)) & 1u) ? kv : dv;
  }
}

// f[i] = multiplier of stream element s0 + i: scale or 0, or 1 when dropout is off.
template <typename A>
void fill_factors(A* f, uint64_t s0, int64_t n, const DropoutParams& d) {
  if (d.threshold == 0) {
    std::fill(f, f + n, A(1));
    return;
  }
  fill_keep<A>(f, s0, n, d, static_cast<A>(d.scale), A(0));
}

template <typename T, Act ACT, bool RESID>
void fwd_impl(const T* x, const T* bias, const T* residual, T* y, int64_t rows, int64_t cols,
              const DropoutParams& d) {
  using A = acc_t<T>;
  const int64_t n = rows * cols;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  parallel_for(blocks, 1, [&](int64_t b0, int64_t b1) {
    std::vector<A> fbuf(kBlock);
    A* f = fbuf.data();
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t e0 = blk * kBlock, e1 = std::min(n, e0 + kBlock);
      fill_factors(f, d.offset + static_cast<uint64_t>(e0), e1 - e0, d);
      // Walk the block in row segments so the bias index is a contiguous run.
      int64_t c = e0 % cols;
      for (int64_t e = e0; e < e1;) {
        const int64_t seg = std::min(cols - c, e1 - e);
        const T* xe = x + e;
        const T* be = bias + c;
        const A* fe = f + (e - e0);
        T* ye = y + e;
        if constexpr (RESID) {
          const T* re = residual + e;
          for (int64_t j = 0; j < seg; ++j) {
            const A h = act_fwd<ACT, A>(static_cast<A>(xe[j]) + static_cast<A>(be[j])) * fe[j];
            ye[j] = static_cast<T>(static_cast<A>(re[j]) + h);
          }
        } else {
          for (int64_t j = 0; j < seg; ++j) {
            ye[j] = static_cast<T>(act_fwd<ACT, A>(static_cast<A>(xe[j]) + static_cast<A>(be[j])) * fe[j]);
          }
        }
        e += seg;
        c = 0;
      }
    }
  });
}

template <typename T, Act ACT>
void bwd_impl(const T* dy, const T* x, const T* bias, T* dx, T* dbias, int64_t rows, int64_t cols,
              const DropoutParams& d) {
  using A = acc_t<T>;
  const int64_t chunks = (rows + kRowsPerChunk - 1) / kRowsPerChunk;
  std::vector<A> partial(static_cast<size_t>(chunks * cols));
  // Step 1: per chunk of rows, dx and the chunk's column sums (rows in order).
  parallel_for(chunks, 1, [&](int64_t k0, int64_t k1) {
    std::vector<A> fbuf(cols);
    A* f = fbuf.data();
    for (int64_t k = k0; k < k1; ++k) {
      A* s = partial.data() + k * cols;
      std::fill(s, s + cols, A(0));
      const int64_t r1 = std::min(rows, (k + 1) * kRowsPerChunk);
      for (int64_t r = k * kRowsPerChunk; r < r1; ++r) {
        const int64_t e0 = r * cols;
        fill_factors(f, d.offset + static_cast<uint64_t>(e0), cols, d);
        const T* dyr = dy + e0;
        T* dxr = dx + e0;
        if constexpr (ACT == Act::kIdentity) {
          for (int64_t c = 0; c < cols; ++c) {
            const A g = static_cast<A>(dyr[c]) * f[c];
            dxr[c] = static_cast<T>(g);
            s[c] += g;
          }
        } else {
          const T* xr = x + e0;
          for (int64_t c = 0; c < cols; ++c) {
            const A g = static_cast<A>(dyr[c]) * f[c] *
                        act_grad<ACT, A>(static_cast<A>(xr[c]) + static_cast<A>(bias[c]));
            dxr[c] = static_cast<T>(g);
            s[c] += g;
          }
        }
      }
    }
  });
  // Step 2: dbias[c] = sum of the chunk sums in chunk order; columns split across threads.
  parallel_for(cols, 256, [&](int64_t c0, int64_t c1) {
    std::vector<A> acc(c1 - c0, A(0));
    for (int64_t k = 0; k < chunks; ++k) {
      const A* s = partial.data() + k * cols;
      for (int64_t c = c0; c < c1; ++c) acc[c - c0] += s[c];
    }
    for (int64_t c = c0; c < c1; ++c) dbias[c] = static_cast<T>(acc[c - c0]);
  });
}

}  // namespace

void dropout_mask(bool* keep, int64_t n, const DropoutParams& d) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  parallel_for(blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t e0 = blk * kBlock, e1 = std::min(n, e0 + kBlock);
      fill_keep<bool>(keep + e0, d.offset + static_cast<uint64_t>(e0), e1 - e0, d, true, false);
    }
  });
}

template <typename T>
void bias_act_dropout_fwd(const T* x, const T* bias, const T* residual, T* y, int64_t rows, int64_t cols, Act act,
                          const DropoutParams& d) {
  if (rows == 0 || cols == 0) return;
  if (residual != nullptr) {
    // bias + dropout + residual has no activation; other combinations are not needed by the model.
    fwd_impl<T, Act::kIdentity, true>(x, bias, residual, y, rows, cols, d);
    return;
  }
  switch (act) {
    case Act::kIdentity: fwd_impl<T, Act::kIdentity, false>(x, bias, nullptr, y, rows, cols, d); break;
    case Act::kRelu: fwd_impl<T, Act::kRelu, false>(x, bias, nullptr, y, rows, cols, d); break;
    case Act::kGelu: fwd_impl<T, Act::kGelu, false>(x, bias, nullptr, y, rows, cols, d); break;
    case Act::kGeluTanh: fwd_impl<T, Act::kGeluTanh, false>(x, bias, nullptr, y, rows, cols, d); break;
  }
}

template <typename T>
void bias_act_dropout_bwd(const T* dy, const T* x, const T* bias, T* dx, T* dbias, int64_t rows, int64_t cols,
                          Act act, const DropoutParams& d) {
  if (cols == 0) return;
  switch (act) {
    case Act::kIdentity: bwd_impl<T, Act::kIdentity>(dy, x, bias, dx, dbias, rows, cols, d); break;
    case Act::kRelu: bwd_impl<T, Act::kRelu>(dy, x, bias, dx, dbias, rows, cols, d); break;
    case Act::kGelu: bwd_impl<T, Act::kGelu>(dy, x, bias, dx, dbias, rows, cols, d); break;
    case Act::kGeluTanh: bwd_impl<T, Act::kGeluTanh>(dy, x, bias, dx, dbias, rows, cols, d); break;
  }
}

#define FLS_INSTANTIATE_DROPOUT(T)                                                                            \
  template void bias_act_dropout_fwd<T>(const T*, const T*, const T*, T*, int64_t, int64_t, Act,              \
                                        const DropoutParams&);                                                \
  template void bias_act_dropout_bwd<T>(const T*, const T*, const T*, T*, T*, int64_t, int64_t, Act,          \
                                        const DropoutParams&);
FLS_CPU_INSTANTIATE(FLS_INSTANTIATE_DROPOUT)

}  // namespace cpu
}  // namespace fls
