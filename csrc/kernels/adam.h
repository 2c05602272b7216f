// Kernel interface of the fused multi-tensor Adam step (per-element math in fls/adam.h): the params the op
// layer fills (csrc/ops/adam.cpp) and the entry point of each device (csrc/cpu/adam.cpp, csrc/cuda/adam.cu).
// Plain C++, included by the CUDA file.
#pragma once
#include <cstdint>

#include "fls/adam.h"
#include "fls/common.h"
#include "cuda_launcher.h"

namespace fls {

// Updates every tensor of the table in place: p, m, v fp32 [n]; g: [n] of grad_dtype (fp32, fp16 or bf16),
// read only. `tensors` lives in the memory of the device that runs the step.
struct AdamStepParams {
  DType grad_dtype;
  const AdamTensor* tensors;
  int64_t num_tensors;
  AdamCoeffs coeffs;
};

// Work is split into fixed chunks over all tensors together, so many small tensors (biases, norms) share
// threads with large ones.
namespace cpu {
void adam_step(const AdamStepParams& p);
}  // namespace cpu

// CUDA launchers return a cudaError_t as int (0 = ok).
namespace cuda {
// Elements one block updates per work item; a tensor of n elements has ceil(n / kAdamChunk) chunks.
constexpr int64_t kAdamChunk = 32768;

// Packs a work item: chunk `chunk` (elements [chunk*kAdamChunk, ...)) of tensor `tensor`.
inline int64_t adam_chunk_entry(int64_t tensor, int64_t chunk) { return (tensor << 32) | chunk; }

// One launch over all chunks; chunks: device array of num_chunks adam_chunk_entry values.
FLS_CUDA_LAUNCHER int adam_step(const AdamStepParams& p, const int64_t* chunks, int64_t num_chunks, void* stream);
}  // namespace cuda

}  // namespace fls
