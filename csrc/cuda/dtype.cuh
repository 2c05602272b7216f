// Storage <-> float conversions and the DType dispatch used by every CUDA kernel file.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "fls/common.h"

namespace fls {
namespace cuda {

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// Sum of `v` over the block; every thread gets the result. `scratch` holds >= 32 floats.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nwarps ? scratch[lane] : 0.0f;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nwarps ? scratch[lane] : -INFINITY;
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

inline int grid_1d(int64_t work, int threads, int max_blocks = 65535 * 16) {
  int64_t b = (work + threads - 1) / threads;
  if (b < 1) b = 1;
  return static_cast<int>(b < max_blocks ? b : max_blocks);
}

}  // namespace cuda
}  // namespace fls

// Runs the statement with `scalar_t` bound to the storage type of `dt` (fp32, fp16 or bf16).
#define FLS_CUDA_DISPATCH(dt, ...)                         \
  switch (dt) {                                            \
    case ::fls::DType::kFloat32: {                         \
      using scalar_t = float;                              \
      __VA_ARGS__;                                         \
    } break;                                               \
    case ::fls::DType::kFloat16: {                         \
      using scalar_t = __half;                             \
      __VA_ARGS__;                                         \
    } break;                                               \
    case ::fls::DType::kBFloat16: {                        \
      using scalar_t = __nv_bfloat16;                      \
      __VA_ARGS__;                                         \
    } break;                                               \
    default:                                               \
      return cudaErrorInvalidValue;                        \
  }

// Launches return the launch status; the ATen wrapper turns a failure into a TORCH_CHECK error.
#define FLS_CUDA_RETURN_LAST_ERROR() return cudaGetLastError()
