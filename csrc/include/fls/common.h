// Shared definitions for host (C++) and device (CUDA) code. No ATen here: the CUDA files include
// this and must compile with plain `nvcc -c`.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define FLS_HD __host__ __device__ __forceinline__
#else
#define FLS_HD inline
#endif

namespace fls {

// Storage dtype of a tensor handed to a raw-pointer kernel. Math is always done in float32
// (float64 for kFloat64, which exists so that CPU backward passes can be gradchecked).
enum class DType : int { kFloat32 = 0, kFloat64 = 1, kFloat16 = 2, kBFloat16 = 3 };

// Parameters of one dropout draw; see philox.h for how the mask is derived from them.
struct DropoutParams {
  uint64_t seed;       // key of the Philox generator
  uint64_t offset;     // index of the first element in the generator's stream
  uint32_t threshold;  // keep an element iff (philox_u32 >> 8) >= threshold; 0 disables dropout
  float scale;         // 1 / (1 - p) for kept elements (0 when p == 1)
};

}  // namespace fls
