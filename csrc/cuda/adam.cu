// Fused multi-tensor Adam step: one launch updates every chunk of every tensor. Each block takes a
// chunk (grid-stride over chunks), reads the tensor's pointers from the device table, and runs a
// 4-wide vector loop when the pointers allow it, then a scalar tail, so any size is covered.
#include <cstdint>

#include "../kernels/adam.h"
#include "dtype.cuh"
#include "launch.cuh"
#include "vec.cuh"

namespace fls {
namespace cuda {
namespace {

constexpr int kThreads = 256;

// The 4 gradients at g (16-byte aligned for fp32, 8 for fp16/bf16) as floats, from one vector load of 32-bit
// words: a struct of four 2-byte elements would be read one element at a time by the emulated device's host
// compiler, four 2-byte requests a lane in the kernel profile where nvcc makes one.
template <typename G>
__device__ __forceinline__ void load4(const G* g, float (&f)[4]) {
  uint4 u;
  if constexpr (sizeof(G) == 4) {
    u = *reinterpret_cast<const uint4*>(g);
  } else {
    const uint2 w = *reinterpret_cast<const uint2*>(g);
    u = make_uint4(w.x, w.y, 0u, 0u);
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) f[j] = unpack<G>(u, j);
}

template <typename G>
__global__ void __launch_bounds__(kThreads) adam_kernel(const AdamTensor* __restrict__ tensors,
                                                        const int64_t* __restrict__ chunks, int64_t num_chunks,
                                                        AdamCoeffs c) {
  for (int64_t k = blockIdx.x; k < num_chunks; k += gridDim.x) {
    const int64_t entry = chunks[k];
    const AdamTensor t = tensors[entry >> 32];
    const int64_t start = (entry & 0xffffffffLL) * kAdamChunk;
    const int64_t len = t.n - start < kAdamChunk ? t.n - start : kAdamChunk;
    float* __restrict__ p = t.p + start;
    float* __restrict__ m = t.m + start;
    float* __restrict__ v = t.v + start;
    const G* __restrict__ g = static_cast<const G*>(t.g) + start;
    const bool aligned = ((reinterpret_cast<uintptr_t>(p) | reinterpret_cast<uintptr_t>(m) |
                           reinterpret_cast<uintptr_t>(v)) % 16 == 0) &&
                         (reinterpret_cast<uintptr_t>(g) % (4 * sizeof(G)) == 0);
    const int64_t vec_end = aligned ? (len & ~int64_t(3)) : 0;
    for (int64_t i = 4 * static_cast<int64_t>(threadIdx.x); i < vec_end; i += 4 * kThreads) {
      float4 pv = *reinterpret_cast<const float4*>(p + i);
      float4 mv = *reinterpret_cast<const float4*>(m + i);
      float4 vv = *reinterpret_cast<const float4*>(v + i);
      float gv[4];
      load4(g + i, gv);
      adam_update(pv.x, mv.x, vv.x, gv[0], c);
      adam_update(pv.y, mv.y, vv.y, gv[1], c);
      adam_update(pv.z, mv.z, vv.z, gv[2], c);
      adam_update(pv.w, mv.w, vv.w, gv[3], c);
      *reinterpret_cast<float4*>(p + i) = pv;
      *reinterpret_cast<float4*>(m + i) = mv;
      *reinterpret_cast<float4*>(v + i) = vv;
    }
    for (int64_t i = vec_end + threadIdx.x; i < len; i += kThreads) {
      adam_update(p[i], m[i], v[i], to_float(g[i]), c);
    }
  }
}

}  // namespace

int adam_step(const AdamStepParams& p, const int64_t* chunks, int64_t num_chunks, void* stream) {
  if (num_chunks == 0) return 0;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int blocks = static_cast<int>(num_chunks < 65535LL * 16 ? num_chunks : 65535LL * 16);
  FLS_CUDA_DISPATCH(p.grad_dtype,
                    launch<adam_kernel<scalar_t>>(blocks, kThreads, 0, s, p.tensors, chunks, num_chunks, p.coeffs));
  FLS_CUDA_RETURN_LAST_ERROR();
}

}  // namespace cuda
}  // namespace fls
