// Storage <-> float conversions of one element and the DType dispatch of the launchers.
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

