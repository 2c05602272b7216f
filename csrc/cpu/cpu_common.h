// Helpers shared by the CPU kernel files: the accumulation type and parallel loops.
#pragma once
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>

#include <type_traits>

#include "fls/common.h"

namespace fls {
namespace cpu {

// Math type for storage type T: float64 stays float64 (gradcheck), everything else uses float32.
template <typename T>
using acc_t = typename std::conditional<std::is_same<T, double>::value, double, float>::type;

// Grain (in items of `item_elems` elements each) that gives every task at least 32k elements, torch's
// own grain (at::internal::GRAIN_SIZE): smaller tensors run on one thread, where a parallel region would
// cost more than it saves. Every kernel family uses it (attention and embedding took 16k and 4k
// elements before), so decoding's small per-step calls stay on one thread. Not larger: a parallel
// region waits for every thread of the pool (a scheduler time slice when another process holds a core:
// 5-8 ms for a [320, 128] layer norm at 2 threads on a busy 2-vCPU VM), but on an idle machine two
// threads win from about this size (beam-5 decoding at the demo's widths: 1.06x native's speed with
// 32k, 0.975x with 64k).
inline int64_t grain_for(int64_t item_elems) {
  constexpr int64_t kGrainElems = 32768;
  return item_elems >= kGrainElems ? 1 : kGrainElems / (item_elems > 0 ? item_elems : 1);
}

// Runs f(begin, end) over [0, n) on torch's intra-op thread pool, in chunks of >= grain items.
template <typename F>
inline void parallel_for(int64_t n, int64_t grain, const F& f) {
  at::parallel_for(0, n, grain, f);
}

}  // namespace cpu
}  // namespace fls

// Hot CPU loops (Philox, softmax rows, cross-entropy rows, activations) are compiled as AVX-512,
// AVX2 and baseline clones picked at load time (gcc function multi-versioning): the build's -march
// (setup.py) may be portable x86-64 (SSE2), while AVX2 runs 8 lanes and AVX-512 16. Single-feature
// targets: "arch=" targets also demand features (e.g. rdrnd) that some virtual CPUs hide.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define FLS_CPU_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define FLS_CPU_CLONES
#endif

// Runs the statements with `scalar_t` bound to the CPU storage type of `dt` (float32, float64 or bfloat16):
// the CPU entry points take a DType and raw pointers, as the CUDA launchers do.
#define FLS_CPU_DISPATCH(dt, ...)                                                     \
  switch (dt) {                                                                       \
    case ::fls::DType::kFloat32: {                                                    \
      using scalar_t = float;                                                         \
      __VA_ARGS__;                                                                    \
    } break;                                                                          \
    case ::fls::DType::kFloat64: {                                                    \
      using scalar_t = double;                                                        \
      __VA_ARGS__;                                                                    \
    } break;                                                                          \
    case ::fls::DType::kBFloat16: {                                                   \
      using scalar_t = c10::BFloat16;                                                 \
      __VA_ARGS__;                                                                    \
    } break;                                                                          \
    default:                                                                          \
      TORCH_CHECK(false, "fairseq_lightseq: no CPU kernel for dtype ", static_cast<int>(dt)); \
  }
