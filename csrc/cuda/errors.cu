#include <cuda_runtime.h>

namespace fls {
const char* cuda_error_string(int err) { return cudaGetErrorString(static_cast<cudaError_t>(err)); }
}  // namespace fls
