// FP ops here never raise traps we care about (as in attention.cpp: the masked row loops vectorise), and
// a * b + c may fuse: the tile products below are FMA chains (the build's -ffp-contract=off is for the
// kernels that promise bitwise equality with a reference; these do not).
#pragma GCC optimize("no-trapping-math", "fp-contract=fast")
// Varlen attention on CPU: one work item per (sentence, head), math in acc_t (float64 for float64, else
// float32). An item copies its keys and values into per-thread tiles (converted to acc_t, padded to whole
// vectors; the keys also transposed), then runs its queries in blocks (block_rows): the block's scores as a
// small GEMM against all the keys its rows see, the softmax rows, the next GEMMs (fp32 with D a multiple of
// 16 writes the outputs in place, see Operand). An item owns its sentence's query rows and, in
// backward, its key rows of that head, so the gradients are written without atomics, and each item's
// arithmetic is the same whichever thread runs it: the results do not depend on the thread count.
// Memory: the per-thread tiles (a sentence's keys and values, a block of queries' scores), nothing batch-sized.
#include "../kernels/varlen_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "cpu_common.h"
#include "fls/fast_math.h"
#include "philox_batch.h"

namespace fls {
namespace cpu {
namespace {

// Queries per block: multiples of the AVX-512 GEMM's row block (8). A causal block computes the keys its
// last row sees, so causal items take short blocks (16 rows: 2/3 of the full square's work at 48 keys,
// 0.56 at 128), the others long ones (fewer passes over the item's keys).
constexpr int64_t kBlockQ = 48, kBlockQCausal = 16;
inline int64_t block_rows(const VarlenProblem& s) { return s.causal ? kBlockQCausal : kBlockQ; }

// Tiles are padded to whole 64-byte vectors (16 floats, 8 doubles): kLanes<A> elements.
template <typename A>
constexpr int64_t kLanes = 64 / sizeof(A);

inline int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// The _t templates below are inlined into each instruction-set variant of their caller (gcc does not inline
// functions this large on its own, and a call would run the baseline build's code).
#define FLS_INLINE inline __attribute__((always_inline))

// c[r, 0:S * kLanes] (= or +=) sum_k a[r * ars + k * acs] * b[k * ldb + 0:S * kLanes] for r < R: R rows of S
// 64-byte column strips of C, held in registers as vectors of VB bytes (GCC vector extensions), k in order.
// Each element of C is one chain of multiply-adds in k order, whatever VB, R and S: the variants below give
// the same numbers where they have the same FMA.
template <typename A, int VB, int R, int S>
FLS_INLINE void gemm_rows(int64_t K, const A* a, int64_t ars, int64_t acs, const A* b, int64_t ldb, A* c,
                          int64_t ldc, bool add) {
  typedef A V __attribute__((vector_size(VB), aligned(sizeof(A)), __may_alias__));
  constexpr int NV = S * 64 / VB, L = VB / sizeof(A);
  V acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = add ? *reinterpret_cast<const V*>(c + r * ldc + v * L) : V{};
  for (int64_t k = 0; k < K; ++k) {
    V bk[NV];
    for (int v = 0; v < NV; ++v) bk[v] = *reinterpret_cast<const V*>(b + k * ldb + v * L);
    for (int r = 0; r < R; ++r) {
      const A x = a[r * ars + k * acs];
      for (int v = 0; v < NV; ++v) acc[r][v] += x * bk[v];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) *reinterpret_cast<V*>(c + r * ldc + v * L) = acc[r][v];
}

// The last rows < R of a column block.
template <typename A, int VB, int R, int S>
FLS_INLINE void gemm_tail(int64_t rows, int64_t K, const A* a, int64_t ars, int64_t acs, const A* b, int64_t ldb,
                          A* c, int64_t ldc, bool add) {
  if constexpr (R > 0) {
    if (rows == R)
      gemm_rows<A, VB, R, S>(K, a, ars, acs, b, ldb, c, ldc, add);
    else
      gemm_tail<A, VB, R - 1, S>(rows, K, a, ars, acs, b, ldb, c, ldc, add);
  }
}

// Columns [n, n + S * kLanes) of C, all M rows.
template <typename A, int VB, int R, int S>
FLS_INLINE void gemm_cols(int64_t n, int64_t M, int64_t K, const A* a, int64_t ars, int64_t acs, const A* b,
                          int64_t ldb, A* c, int64_t ldc, bool add) {
  int64_t m = 0;
  for (; m + R <= M; m += R) gemm_rows<A, VB, R, S>(K, a + m * ars, ars, acs, b + n, ldb, c + m * ldc + n, ldc, add);
  gemm_tail<A, VB, R - 1, S>(M - m, K, a + m * ars, ars, acs, b + n, ldb, c + m * ldc + n, ldc, add);
}

// C[M, N] (= or +=) A[M, K] B[K, N]: A(m, k) = a[m * ars + k * acs] (any strides: a transposed operand is
// read in place), B and C row-major with N a multiple of kLanes<A> (the tiles are padded to whole
// vectors). Blocks of R rows by S 64-byte strips (R * S * 64 / VB accumulator registers), then one strip.
template <typename A, int VB, int R, int S>
FLS_INLINE void gemm_t(int64_t M, int64_t N, int64_t K, const A* a, int64_t ars, int64_t acs, const A* b,
                       int64_t ldb, A* c, int64_t ldc, bool add) {
  int64_t n = 0;
  for (; n + S * kLanes<A> <= N; n += S * kLanes<A>) gemm_cols<A, VB, R, S>(n, M, K, a, ars, acs, b, ldb, c, ldc, add);
  if constexpr (S > 1)
    for (; n < N; n += kLanes<A>) gemm_cols<A, VB, R, 1>(n, M, K, a, ars, acs, b, ldb, c, ldc, add);
}

// The float GEMM in the widest vectors the CPU has, picked at the first call (as FLS_CPU_CLONES picks,
// but each variant with its own vector width: 64-byte vectors under AVX2 compile to stack traffic):
// AVX-512, 8 rows by 2 zmm (16 of 32 registers: 2 vector loads and 8 broadcasts per 16 FMAs, and enough
// independent chains to cover the FMA latency); AVX2, 6 rows by 2 ymm (12 of 16); baseline, 3 rows by 4 xmm.
using GemmF = void (*)(int64_t, int64_t, int64_t, const float*, int64_t, int64_t, const float*, int64_t, float*,
                       int64_t, bool);
void gemm_base(int64_t M, int64_t N, int64_t K, const float* a, int64_t ars, int64_t acs, const float* b,
               int64_t ldb, float* c, int64_t ldc, bool add) {
  gemm_t<float, 16, 3, 1>(M, N, K, a, ars, acs, b, ldb, c, ldc, add);
}
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
__attribute__((target("avx512f"))) void gemm_avx512(int64_t M, int64_t N, int64_t K, const float* a, int64_t ars,
                                                    int64_t acs, const float* b, int64_t ldb, float* c, int64_t ldc,
                                                    bool add) {
  gemm_t<float, 64, 8, 2>(M, N, K, a, ars, acs, b, ldb, c, ldc, add);
}
__attribute__((target("avx2,fma"))) void gemm_avx2(int64_t M, int64_t N, int64_t K, const float* a, int64_t ars,
                                                   int64_t acs, const float* b, int64_t ldb, float* c, int64_t ldc,
                                                   bool add) {
  gemm_t<float, 32, 6, 1>(M, N, K, a, ars, acs, b, ldb, c, ldc, add);
}
GemmF pick_gemm() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return gemm_avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return gemm_avx2;
  return gemm_base;
}
#else
GemmF pick_gemm() { return gemm_base; }
#endif

void gemm(int64_t M, int64_t N, int64_t K, const float* a, int64_t ars, int64_t acs, const float* b, int64_t ldb,
          float* c, int64_t ldc, bool add) {
  static const GemmF f = pick_gemm();
  f(M, N, K, a, ars, acs, b, ldb, c, ldc, add);
}
// float64: gradcheck only.
void gemm(int64_t M, int64_t N, int64_t K, const double* a, int64_t ars, int64_t acs, const double* b, int64_t ldb,
          double* c, int64_t ldc, bool add) {
  gemm_t<double, 16, 3, 1>(M, N, K, a, ars, acs, b, ldb, c, ldc, add);
}

// exp for the softmax rows (x <= 0, -inf included, which gives 0): float fls::exp_nonpos_f32 (vectorises),
// float64 std::exp.
FLS_INLINE float exp_le0(float x) { return exp_nonpos_f32(x); }
inline double exp_le0(double x) { return std::exp(x); }

// The row loops run over whole vectors, nbp = the block's key count rounded up to kLanes<A>: the keys past
// the row's own n are set to -inf first (exp 0), so that no loop needs a mask or a tail, and kLanes<A> lanes
// are reduced as a tree at the end (log2 dependent steps; omp simd's reduction adds the lanes one after the
// other, which at 48 keys cost more than the row). Unrolled, so that the lanes stay in registers.
template <typename A>
FLS_INLINE A lanes_max(A* m) {
#pragma GCC unroll 4
  for (int w = kLanes<A> / 2; w > 0; w /= 2)
#pragma GCC unroll 8
    for (int k = 0; k < w; ++k) m[k] = m[k + w] > m[k] ? m[k + w] : m[k];
  return m[0];
}
template <typename A>
FLS_INLINE A lanes_sum(A* a) {
#pragma GCC unroll 4
  for (int w = kLanes<A> / 2; w > 0; w /= 2)
#pragma GCC unroll 8
    for (int k = 0; k < w; ++k) a[k] += a[k + w];
  return a[0];
}

// Forward softmax row in place: s[0:n] (raw q.k) -> dropout(softmax(sc * s)) (fac: the dropout multipliers,
// nullptr without dropout), s[n:nbp] = 0 (keys a causal row does not see but its block does, and the pad to
// whole vectors). Returns the log-sum-exp of sc * s[0:n] (-inf for n == 0).
template <typename A>
FLS_INLINE A fwd_row_t(A* s, const A* fac, A sc, int64_t n, int64_t nbp) {
  constexpr int L = kLanes<A>;
  const A ninf = -std::numeric_limits<A>::infinity();
  if (n == 0) {
    std::fill(s, s + nbp, A(0));
    return ninf;
  }
  for (int64_t j = 0; j < n; ++j) s[j] *= sc;
  std::fill(s + n, s + nbp, ninf);
  A mx[L], a[L];
  for (int k = 0; k < L; ++k) mx[k] = ninf, a[k] = 0;
  for (int64_t j = 0; j < nbp; j += L)
    for (int k = 0; k < L; ++k) mx[k] = s[j + k] > mx[k] ? s[j + k] : mx[k];
  const A m = lanes_max(mx);
  for (int64_t j = 0; j < nbp; j += L)
    for (int k = 0; k < L; ++k) {
      s[j + k] = exp_le0(s[j + k] - m);
      a[k] += s[j + k];
    }
  const A sum = lanes_sum(a), inv = A(1) / sum;
  if (fac) {
    for (int64_t j = 0; j < nbp; ++j) s[j] = s[j] * inv * fac[j];
  } else {
    for (int64_t j = 0; j < nbp; ++j) s[j] *= inv;
  }
  return m + std::log(sum);
}
FLS_CPU_CLONES float fwd_row(float* s, const float* fac, float sc, int64_t n, int64_t nbp) {
  return fwd_row_t(s, fac, sc, n, nbp);
}
double fwd_row(double* s, const double* fac, double sc, int64_t n, int64_t nbp) {
  return fwd_row_t(s, fac, sc, n, nbp);
}

// Backward row in place, from the raw scores s[0:n] and g[0:n] = dout_i . v_j: P = exp(sc * s - lse),
// dP = fac * g, then g -> sc * dS = sc * P (dP - sum_j P dP) (the gradient of the raw scores) and
// s -> P * fac (the dropped probabilities, for dv); both 0 on [n, nbp) (P is; fac is 0 there too).
template <typename A>
FLS_INLINE void bwd_row_t(A* s, A* g, const A* fac, A sc, A lse, int64_t n, int64_t nbp) {
  constexpr int L = kLanes<A>;
  const A ninf = -std::numeric_limits<A>::infinity();
  A a[L] = {};
  for (int64_t j = 0; j < n; ++j) s[j] = sc * s[j] - lse;
  std::fill(s + n, s + nbp, ninf);
  for (int64_t j = 0; j < nbp; j += L)
    for (int k = 0; k < L; ++k) {
      s[j + k] = exp_le0(s[j + k]);
      if (fac) g[j + k] *= fac[j + k];
      a[k] += s[j + k] * g[j + k];
    }
  const A rowsum = lanes_sum(a);
  for (int64_t j = 0; j < nbp; ++j) {
    g[j] = sc * s[j] * (g[j] - rowsum);
    if (fac) s[j] *= fac[j];
  }
}
FLS_CPU_CLONES void bwd_row(float* s, float* g, const float* fac, float sc, float lse, int64_t n, int64_t nbp) {
  bwd_row_t(s, g, fac, sc, lse, n, nbp);
}
void bwd_row(double* s, double* g, const double* fac, double sc, double lse, int64_t n, int64_t nbp) {
  bwd_row_t(s, g, fac, sc, lse, n, nbp);
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

// Tiles of one item in acc_t, from [N, H, D] rows r0.. of head h: rows (dst [n, ld], ld >= D, columns D..ld
// left as they are: zero from allocation) or transposed (dst [D, ld], ld >= n, columns n..ld zeroed).
template <typename T, typename A>
inline void load_rows(const T* x, int64_t r0, int64_t n, int64_t h, int64_t H, int64_t D, A* dst, int64_t ld) {
  for (int64_t r = 0; r < n; ++r) {
    const T* src = x + ((r0 + r) * H + h) * D;
    for (int64_t d = 0; d < D; ++d) dst[r * ld + d] = static_cast<A>(src[d]);
  }
}

#if defined(__GNUC__) && !defined(__clang__)
// dst[c * ld + 0:8] = column c of the 8 x 8 block at src (rows sr apart), c < 8: three rounds of shuffles
// (unpack, 64-bit pairs, 128-bit halves) instead of 64 single-element stores a column apart.
inline void transpose8(const float* src, int64_t sr, float* dst, int64_t ld) {
  typedef float V __attribute__((vector_size(32), aligned(4), __may_alias__));
  typedef int32_t I __attribute__((vector_size(32)));
  V r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = *reinterpret_cast<const V*>(src + i * sr);
  for (int i = 0; i < 8; i += 2) {
    t[i] = __builtin_shuffle(r[i], r[i + 1], I{0, 8, 1, 9, 4, 12, 5, 13});
    t[i + 1] = __builtin_shuffle(r[i], r[i + 1], I{2, 10, 3, 11, 6, 14, 7, 15});
  }
  for (int i = 0; i < 8; i += 4)
    for (int j = 0; j < 2; ++j) {
      r[i + 2 * j] = __builtin_shuffle(t[i + j], t[i + j + 2], I{0, 1, 8, 9, 4, 5, 12, 13});
      r[i + 2 * j + 1] = __builtin_shuffle(t[i + j], t[i + j + 2], I{2, 3, 10, 11, 6, 7, 14, 15});
    }
  for (int c = 0; c < 4; ++c) {
    *reinterpret_cast<V*>(dst + c * ld) = __builtin_shuffle(r[c], r[c + 4], I{0, 1, 2, 3, 8, 9, 10, 11});
    *reinterpret_cast<V*>(dst + (c + 4) * ld) = __builtin_shuffle(r[c], r[c + 4], I{4, 5, 6, 7, 12, 13, 14, 15});
  }
}
#endif

template <typename T, typename A>
inline void load_cols(const T* x, int64_t r0, int64_t n, int64_t h, int64_t H, int64_t D, A* dst, int64_t ld) {
  const T* src = x + (r0 * H + h) * D;
  const int64_t sr = H * D;
  int64_t r = 0;
#if defined(__GNUC__) && !defined(__clang__)  // __builtin_shuffle (clang: __builtin_shufflevector)
  if constexpr (std::is_same_v<T, float>) {
    for (; r + 8 <= n; r += 8) {
      int64_t d = 0;
      for (; d + 8 <= D; d += 8) transpose8(src + r * sr + d, sr, dst + d * ld + r, ld);
      for (; d < D; ++d)
        for (int64_t i = r; i < r + 8; ++i) dst[d * ld + i] = src[i * sr + d];
    }
  }
#endif
  for (; r < n; ++r)
    for (int64_t d = 0; d < D; ++d) dst[d * ld + r] = static_cast<A>(src[r * sr + d]);
  for (int64_t d = 0; d < D; ++d) std::fill(dst + d * ld + n, dst + d * ld + ld, A(0));
}
// The inverse of load_rows.
template <typename T, typename A>
inline void store_rows(const A* src, int64_t ld, int64_t r0, int64_t n, int64_t h, int64_t H, int64_t D, T* x) {
  for (int64_t r = 0; r < n; ++r) {
    T* dst = x + ((r0 + r) * H + h) * D;
    for (int64_t d = 0; d < D; ++d) dst[d] = static_cast<T>(src[r * ld + d]);
  }
}

// A [N, H, D] tensor's rows r0.. of head h as a GEMM's C (or, forward, A) operand: in place (rows H * D
// apart) where the storage type is acc_t and D is whole vectors (a GEMM writes every row's padded width),
// else the tile `t` (rows ld apart), which the caller fills or empties; `in_place` tells which. B operands
// (the rows a GEMM reads one after the other, K of them per column strip) are always tiles: rows H * D
// apart (1 KB at H = 4, D = 64) fall into few L1 sets, and a long key side evicted its own strip.
template <typename A>
struct Operand {
  A* p;
  int64_t ld;
};
template <typename T, typename A>
constexpr bool kInPlace = std::is_same_v<T, A>;

template <typename A, typename T>
inline Operand<A> rows_of(T* x, int64_t r0, int64_t h, int64_t H, int64_t D, bool in_place, A* t, int64_t ld) {
  if constexpr (kInPlace<std::remove_const_t<T>, A>) {
    if (in_place) return {const_cast<A*>(x) + (r0 * H + h) * D, H * D};
  }
  return {t, ld};
}

// fac[j] = dropout multiplier of key j of query i for j < n, 0 for j in [n, nbp); nullptr when dropout is off.
template <typename A>
inline const A* row_factors(const VarlenProblem& s, const Item& it, int64_t i, int64_t n, int64_t nbp,
                            std::vector<uint32_t>& u, std::vector<A>& fac) {
  if (s.drop.threshold == 0) return nullptr;
  u.resize(dropout_words(n));
  fac.resize(nbp);
  dropout_select(s.drop.offset + varlen_row_stream(s, it.b, it.h, i), n, s.drop, u.data(),
                 static_cast<A>(s.drop.scale), A(0), fac.data());
  std::fill(fac.begin() + n, fac.end(), A(0));
  return fac.data();
}

// The longest key side among items [begin, end).
inline int64_t max_keys(const VarlenProblem& s, int64_t begin, int64_t end) {
  int64_t m = 0;
  for (int64_t bh = begin; bh < end; ++bh) m = std::max<int64_t>(m, item_of(s, bh).Lk);
  return m;
}

// Per query block [i0, i0 + bq): S = Q K^T over the nb keys its last row sees, the softmax rows, O = P V.
template <typename T>
void fwd_impl(const VarlenAttentionFwdParams& p) {
  using A = acc_t<T>;
  constexpr int64_t W = kLanes<A>;
  const VarlenProblem& s = p.s;
  const int64_t H = s.H, D = s.D, Dp = round_up(D, W);
  const bool in_place = kInPlace<T, A> && D == Dp;
  const T* q = static_cast<const T*>(p.q);
  const T* k = static_cast<const T*>(p.k);
  const T* v = static_cast<const T*>(p.v);
  T* out = static_cast<T*>(p.out);
  A* lse = static_cast<A*>(p.lse);
  const A sc = static_cast<A>(s.scale);
  const int64_t BQ = block_rows(s);
  parallel_for(s.B * H, item_grain(s), [&](int64_t begin, int64_t end) {
    const int64_t Lk_max = max_keys(s, begin, end), Lkp_max = round_up(Lk_max, W), tile = in_place ? 0 : 1;
    // kt [D, Lkp]: keys transposed; st [BQ, Lkp]: scores; tiles unless in place: vt [Lk, Dp] values,
    // qt, ot [BQ, Dp] queries and output
    std::vector<A> kt(D * Lkp_max), st(BQ * Lkp_max), vt(Lk_max * Dp), qt(tile * BQ * Dp),
        ot(tile * BQ * Dp), fac;
    std::vector<uint32_t> u;
    for (int64_t bh = begin; bh < end; ++bh) {
      const Item it = item_of(s, bh);
      const int64_t Lkp = round_up(it.Lk, W);
      load_cols(k, it.k0, it.Lk, it.h, H, D, kt.data(), Lkp);
      load_rows(v, it.k0, it.Lk, it.h, H, D, vt.data(), Dp);
      for (int64_t i0 = 0; i0 < it.Lq; i0 += BQ) {
        const int64_t bq = std::min(BQ, it.Lq - i0);
        const int64_t nb = varlen_key_end(s.causal, i0 + bq - 1, it.Lq, it.Lk), nbp = round_up(nb, W);
        const Operand<A> qo = rows_of(q, it.q0 + i0, it.h, H, D, in_place, qt.data(), Dp);
        const Operand<A> oo = rows_of(out, it.q0 + i0, it.h, H, D, in_place, ot.data(), Dp);
        if (!in_place) load_rows(q, it.q0 + i0, bq, it.h, H, D, qt.data(), Dp);
        gemm(bq, nbp, D, qo.p, qo.ld, 1, kt.data(), Lkp, st.data(), Lkp, false);
        for (int64_t r = 0; r < bq; ++r) {
          const int64_t i = i0 + r, n = varlen_key_end(s.causal, i, it.Lq, it.Lk);
          const A* f = row_factors(s, it, i, n, nbp, u, fac);
          lse[(it.q0 + i) * H + it.h] = fwd_row(st.data() + r * Lkp, f, sc, n, nbp);
        }
        gemm(bq, Dp, nb, st.data(), Lkp, 1, vt.data(), Dp, oo.p, oo.ld, false);
        if (!in_place) store_rows(ot.data(), Dp, it.q0 + i0, bq, it.h, H, D, out);
      }
    }
  });
}

// Per query block: S = Q K^T and G = dO V^T again, the backward rows (P, scale * dS, the dropped P), then
// dv += P_drop^T dO, dk += (scale dS)^T Q (accumulated over the blocks in acc_t) and dq = (scale dS) K.
template <typename T>
void bwd_impl(const VarlenAttentionBwdParams& p) {
  using A = acc_t<T>;
  constexpr int64_t W = kLanes<A>;
  const VarlenProblem& s = p.s;
  const int64_t H = s.H, D = s.D, Dp = round_up(D, W);
  const bool in_place = kInPlace<T, A> && D == Dp;
  const T* dout = static_cast<const T*>(p.dout);
  const T* q = static_cast<const T*>(p.q);
  const T* k = static_cast<const T*>(p.k);
  const T* v = static_cast<const T*>(p.v);
  const A* lse = static_cast<const A*>(p.lse);
  T* dq = static_cast<T*>(p.dq);
  T* dk = static_cast<T*>(p.dk);
  T* dv = static_cast<T*>(p.dv);
  const A sc = static_cast<A>(s.scale);
  const int64_t BQ = block_rows(s);
  parallel_for(s.B * H, item_grain(s), [&](int64_t begin, int64_t end) {
    const int64_t Lk_max = max_keys(s, begin, end), Lkp_max = round_up(Lk_max, W), tile = in_place ? 0 : 1;
    // kt, vtt [D, Lkp]: keys and values transposed; st, gs [BQ, Lkp]: scores, dout . v; tiles unless in
    // place: kr [Lk, Dp] keys, qt, gt, dqt [BQ, Dp] queries, dout, dq, dkt, dvt [Lk, Dp] the item's dk, dv
    std::vector<A> kt(D * Lkp_max), vtt(D * Lkp_max), st(BQ * Lkp_max), gs(BQ * Lkp_max),
        kr(Lk_max * Dp), qt(BQ * Dp), gt(BQ * Dp), dqt(tile * BQ * Dp),
        dkt(tile * Lk_max * Dp), dvt(tile * Lk_max * Dp), fac;
    std::vector<uint32_t> u;
    for (int64_t bh = begin; bh < end; ++bh) {
      const Item it = item_of(s, bh);
      const int64_t Lkp = round_up(it.Lk, W);
      load_cols(k, it.k0, it.Lk, it.h, H, D, kt.data(), Lkp);
      load_cols(v, it.k0, it.Lk, it.h, H, D, vtt.data(), Lkp);
      const Operand<A> dko = rows_of(dk, it.k0, it.h, H, D, in_place, dkt.data(), Dp);
      const Operand<A> dvo = rows_of(dv, it.k0, it.h, H, D, in_place, dvt.data(), Dp);
      load_rows(k, it.k0, it.Lk, it.h, H, D, kr.data(), Dp);
      int64_t seen = 0;  // keys [0, seen) have dk, dv rows from earlier blocks (nb grows block by block)
      for (int64_t i0 = 0; i0 < it.Lq; i0 += BQ) {
        const int64_t bq = std::min(BQ, it.Lq - i0);
        const int64_t nb = varlen_key_end(s.causal, i0 + bq - 1, it.Lq, it.Lk), nbp = round_up(nb, W);
        const Operand<A> dqo = rows_of(dq, it.q0 + i0, it.h, H, D, in_place, dqt.data(), Dp);
        load_rows(q, it.q0 + i0, bq, it.h, H, D, qt.data(), Dp);
        load_rows(dout, it.q0 + i0, bq, it.h, H, D, gt.data(), Dp);
        gemm(bq, nbp, D, qt.data(), Dp, 1, kt.data(), Lkp, st.data(), Lkp, false);
        gemm(bq, nbp, D, gt.data(), Dp, 1, vtt.data(), Lkp, gs.data(), Lkp, false);
        for (int64_t r = 0; r < bq; ++r) {
          const int64_t i = i0 + r, n = varlen_key_end(s.causal, i, it.Lq, it.Lk);
          bwd_row(st.data() + r * Lkp, gs.data() + r * Lkp, row_factors(s, it, i, n, nbp, u, fac), sc,
                  lse[(it.q0 + i) * H + it.h], n, nbp);
        }
        // rows [0, seen) accumulate, rows [seen, nb) are written first here
        for (const bool add : {true, false}) {
          const int64_t j0 = add ? 0 : seen, rows = add ? seen : nb - seen;
          gemm(rows, Dp, bq, st.data() + j0, 1, Lkp, gt.data(), Dp, dvo.p + j0 * dvo.ld, dvo.ld, add);
          gemm(rows, Dp, bq, gs.data() + j0, 1, Lkp, qt.data(), Dp, dko.p + j0 * dko.ld, dko.ld, add);
        }
        seen = nb;
        gemm(bq, Dp, nb, gs.data(), Lkp, 1, kr.data(), Dp, dqo.p, dqo.ld, false);
        if (!in_place) store_rows(dqt.data(), Dp, it.q0 + i0, bq, it.h, H, D, dq);
      }
      for (int64_t j = seen; j < it.Lk; ++j) {  // keys no query sees (causal, Lk > Lq)
        std::fill(dko.p + j * dko.ld, dko.p + j * dko.ld + Dp, A(0));
        std::fill(dvo.p + j * dvo.ld, dvo.p + j * dvo.ld + Dp, A(0));
      }
      if (!in_place) {
        store_rows(dkt.data(), Dp, it.k0, it.Lk, it.h, H, D, dk);
        store_rows(dvt.data(), Dp, it.k0, it.Lk, it.h, H, D, dv);
      }
    }
  });
}

}  // namespace

void varlen_attention_fwd(const VarlenAttentionFwdParams& p) { FLS_CPU_DISPATCH(p.dtype, fwd_impl<scalar_t>(p)); }

void varlen_attention_bwd(const VarlenAttentionBwdParams& p) { FLS_CPU_DISPATCH(p.dtype, bwd_impl<scalar_t>(p)); }

}  // namespace cpu
}  // namespace fls
