// CUDA launcher of the fused multi-tensor Adam step (csrc/cuda/adam.cu). Plain C++ declarations so
// the ATen wrapper can include them without CUDA headers; returns a cudaError_t as int (0 = ok).
#pragma once
#include <cstdint>

#include "fls/adam.h"
#include "fls/common.h"

namespace fls {
namespace cuda {

// Elements one block updates per work item; a tensor of n elements has ceil(n / kAdamChunk) chunks.
constexpr int64_t kAdamChunk = 32768;

// Packs a work item: chunk `chunk` (elements [chunk*kAdamChunk, ...)) of tensor `tensor`.
inline int64_t adam_chunk_entry(int64_t tensor, int64_t chunk) { return (tensor << 32) | chunk; }

// One launch over all chunks. tensors: device array of AdamTensor (p, m, v fp32; g of storage dtype
// grad_dtype: fp32, fp16 or bf16); chunks: device array of num_chunks adam_chunk_entry values.
int adam_step(DType grad_dtype, const AdamTensor* tensors, const int64_t* chunks, int64_t num_chunks,
              const AdamCoeffs& coeffs, void* stream);

}  // namespace cuda
}  // namespace fls
