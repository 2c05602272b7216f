// The message of a CUDA error code for the op layer's launch check (FLS_CHECK_LAUNCH in csrc/ops/device.h),
// which includes no CUDA header.
#include <cuda_runtime.h>

#include "../kernels/cuda_launcher.h"

namespace fls {
namespace cuda {

const char* error_string(int error) { return cudaGetErrorString(static_cast<cudaError_t>(error)); }

}  // namespace cuda
}  // namespace fls
