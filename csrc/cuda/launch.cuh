// Launch geometry and launch status shared by the launchers.
#pragma once
#include <cuda_runtime.h>

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

}  // namespace cuda
}  // namespace fls

// Launchers return the launch status; the family's CUDA implementation in the op layer
// (csrc/ops/<family>.cpp, FLS_CHECK_LAUNCH) turns a failure into a TORCH_CHECK error.
#define FLS_CUDA_RETURN_LAST_ERROR() return cudaGetLastError()
