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

// 16 bytes of T (kN elements) travel as one uint4: the unit of the fast paths' vector loads and stores.
// Elements are unpacked from / packed into its 32-bit words with register moves only (j is a
// compile-time constant after unrolling), so the pack never goes through local memory.
template <typename T>
struct Pack {
  static constexpr int kN = 16 / sizeof(T);
};

__device__ __forceinline__ uint32_t word(const uint4& u, int i) {
  return i == 0 ? u.x : (i == 1 ? u.y : (i == 2 ? u.z : u.w));
}

template <typename T>
__device__ __forceinline__ float unpack(const uint4& u, int j);
template <>
__device__ __forceinline__ float unpack<float>(const uint4& u, int j) { return __uint_as_float(word(u, j)); }
template <>
__device__ __forceinline__ float unpack<__half>(const uint4& u, int j) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(word(u, j >> 1) >> ((j & 1) * 16))));
}
template <>
__device__ __forceinline__ float unpack<__nv_bfloat16>(const uint4& u, int j) {
  return __bfloat162float(__ushort_as_bfloat16(static_cast<unsigned short>(word(u, j >> 1) >> ((j & 1) * 16))));
}

// All kN elements of u as floats.
template <typename T>
__device__ __forceinline__ void unpack(const uint4& u, float (&f)[Pack<T>::kN]) {
#pragma unroll
  for (int j = 0; j < Pack<T>::kN; ++j) f[j] = unpack<T>(u, j);
}

__device__ __forceinline__ uint32_t bits16(__half h) { return __half_as_ushort(h); }
__device__ __forceinline__ uint32_t bits16(__nv_bfloat16 h) { return __bfloat16_as_ushort(h); }

// The kN floats f rounded once to T and packed in element order.
template <typename T>
__device__ __forceinline__ uint4 pack(const float* f) {
  if constexpr (sizeof(T) == 4) {
    return make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]), __float_as_uint(f[3]));
  } else {
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = bits16(from_float<T>(f[2 * i])) | (bits16(from_float<T>(f[2 * i + 1])) << 16);
    return make_uint4(w[0], w[1], w[2], w[3]);
  }
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
