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

// The CPU registration of an op with a CUDA twin: `m.impl("op", FLS_CPU_IMPL(op))` registers op_cpu, which
// gives way to op_cuda on the emulated device.
template <auto Cpu, auto Cuda>
struct CpuOrEmulated;
template <typename R, typename... A, R (*Cpu)(A...), R (*Cuda)(A...)>
struct CpuOrEmulated<Cpu, Cuda> {
  static R call(A... a) { return cuda_emulation_on() ? Cuda(a...) : Cpu(a...); }
};
#define FLS_CPU_IMPL(op) (&::fls::CpuOrEmulated<&op##_cpu, &op##_cuda>::call)

// From the first switch of the emulated device on: every CPU allocation made while it is on is poisoned
// (csrc/poisoned_allocator.cpp), so an output element a kernel leaves unwritten fails its test.
void poison_emulated_allocations();

// The current stream of t's device as the launchers take it (a cudaStream_t as void*; none on the emulated
// device, whose launches run in order on the calling thread).
inline void* stream_of(const at::Tensor& t) {
  if (t.is_cpu()) return nullptr;
  return c10::impl::getDeviceGuardImpl(t.device().type())->getStream(t.device()).native_handle();
}

// Launchers return an int cudaError_t (0 = success) so that their headers stay free of CUDA. Their status is
// cudaGetLastError's, which would also report an error left by earlier work on the device (another library's
// kernel, an asynchronous fault): that one is taken first and reported as not this op's.
#define FLS_CHECK_LAUNCH(expr)                                                                                  \
  do {                                                                                                          \
    const int fls_prior_ = cuda::take_last_error();                                                             \
    TORCH_CHECK(fls_prior_ == 0, "fairseq_lightseq: a CUDA error from earlier work on the device, before ", #expr, \
                " ran (not this op's): cudaError ", fls_prior_, " (", cuda::error_string(fls_prior_), ")");     \
    const int fls_err_ = (expr);                                                                                \
    TORCH_CHECK(fls_err_ == 0, "fairseq_lightseq CUDA kernel failed: ", #expr, " returned cudaError ", fls_err_, \
                " (", cuda::error_string(fls_err_), ")");                                                       \
  } while (0)

// Scratch floats for the deterministic column sums of a backward.
inline at::Tensor workspace(int64_t floats, const at::Tensor& like) {
  return at::empty({floats}, like.options().dtype(at::kFloat));
}

constexpr int64_t kMaxRows32 = 2147483647LL;  // row counts that index a 32-bit grid dimension

}  // namespace fls
