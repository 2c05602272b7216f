// What the device implementations of the op layer (csrc/ops/<family>.cpp) share: whether this build has
// the CUDA kernels, and for the CUDA implementations the current stream, scratch memory and the launch
// check. Only torch's device-generic API (c10::DeviceGuard, c10::Stream): no CUDA header, so every build
// compiles the whole op layer, the CPU torch included. The launchers it calls are declared weak
// (csrc/kernels/cuda_launcher.h).
#pragma once
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "../kernels/cuda_launcher.h"
#include "utils.h"

namespace fls {

// Whether this build compiled the CUDA kernels: setup.py defines FLS_WITH_CUDA when it adds csrc/cuda/*.cu.
// Each family registers its CUDA implementations only then; a CPU-only build registers none, so the Python
// ops fall back to the reference ops on CUDA tensors. The one build switch of the op layer.
#ifdef FLS_WITH_CUDA
inline constexpr bool kWithCuda = true;
#else
inline constexpr bool kWithCuda = false;
#endif

// The current stream of t's device as the launchers take it (a cudaStream_t as void*).
inline void* stream_of(const at::Tensor& t) {
  return c10::impl::getDeviceGuardImpl(t.device().type())->getStream(t.device()).native_handle();
}

// Launchers return an int cudaError_t (0 = success) so that their headers stay free of CUDA.
#define FLS_CHECK_LAUNCH(expr)                                                                      \
  do {                                                                                              \
    const int fls_err_ = (expr);                                                                    \
    TORCH_CHECK(fls_err_ == 0, "fairseq_lightseq CUDA kernel failed: ", #expr, " returned cudaError ", \
                fls_err_, " (", cuda::error_string(fls_err_), ")");                               \
  } while (0)

// Scratch floats for the deterministic column sums of a backward.
inline at::Tensor workspace(int64_t floats, const at::Tensor& like) {
  return at::empty({floats}, like.options().dtype(at::kFloat));
}

constexpr int64_t kMaxRows32 = 2147483647LL;  // row counts that index a 32-bit grid dimension

}  // namespace fls
