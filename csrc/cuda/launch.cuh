// Launch geometry, the one launch point and the launch status shared by the launchers.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace fls {
namespace cuda {

// Blocks of `threads` threads for `work` items of a grid-stride kernel: enough for one item per thread, at
// least 1, at most max_blocks (the kernels loop over the rest).
inline int grid_1d(int64_t work, int threads, int max_blocks = 65535 * 16) {
  int64_t b = (work + threads - 1) / threads;
  if (b < 1) b = 1;
  return static_cast<int>(b < max_blocks ? b : max_blocks);
}

// Every kernel launch of csrc/cuda/ goes through here: `launch<kernel<T>>(grid, block, smem, stream, args...)`
// is `kernel<T><<<grid, block, smem, stream>>>(args...)` under nvcc; the emulated build (csrc/emulation/) runs
// the grid on the CPU, after checking the launch against the hardware's limits as CUDA does. Either way the
// status is then cudaGetLastError's.
template <auto Kernel, typename... Args>
inline void launch(dim3 grid, dim3 block, size_t smem, cudaStream_t stream, const Args&... args) {
#ifdef FLS_CUDA_EMULATION
  (void)stream;
  auto call = [&] { Kernel(args...); };
  ::fls_emu::launch(__PRETTY_FUNCTION__, grid, block, smem,
                    [](void* c) { (*static_cast<decltype(call)*>(c))(); }, &call);
#else
  Kernel<<<grid, block, smem, stream>>>(args...);
#endif
}

}  // namespace cuda
}  // namespace fls

// Launchers return the launch status; the family's CUDA implementation in the op layer
// (csrc/ops/<family>.cpp, FLS_CHECK_LAUNCH) turns a failure into a TORCH_CHECK error.
#define FLS_CUDA_RETURN_LAST_ERROR() return cudaGetLastError()
