// The message of a CUDA error code, and the pending error, for the op layer's launch check (FLS_CHECK_LAUNCH
// in csrc/ops/device.h), which includes no CUDA header.
#include <cuda_runtime.h>

#include "../kernels/cuda_launcher.h"

namespace fls {
namespace cuda {

const char* error_string(int error) { return cudaGetErrorString(static_cast<cudaError_t>(error)); }

int take_last_error() { return static_cast<int>(cudaGetLastError()); }

}  // namespace cuda
}  // namespace fls
