// Float reductions across the lanes of a warp, an aligned group of lanes, or a whole block.
#pragma once
#include <cuda_runtime.h>

#include <cmath>

namespace fls {
namespace cuda {

// Sum / max over an aligned group of G lanes of a warp (G a power of two <= 32); every lane of the warp
// must call them, and every lane of the group gets the result.
template <int G>
__device__ __forceinline__ float group_max(float v) {
#pragma unroll
  for (int o = G / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
template <int G>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int o = G / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the 32 lanes of a warp; every lane gets the result.
__device__ __forceinline__ float warp_sum(float v) { return group_sum<32>(v); }

// Sum of `v` over the block; every thread gets the result. `scratch` holds >= 32 floats.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  v = warp_sum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nwarps ? scratch[lane] : 0.0f;
  return warp_sum(v);
}

// Max of `v` over the block; every thread gets the result. `scratch` holds >= 32 floats.
__device__ __forceinline__ float block_max(float v, float* scratch) {
  v = group_max<32>(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nwarps ? scratch[lane] : -INFINITY;
  return group_max<32>(v);
}

}  // namespace cuda
}  // namespace fls
