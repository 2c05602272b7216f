// CUDA launchers of the layer-norm family (csrc/cuda/layer_norm.cu). Plain C++ declarations so the
// ATen wrapper can include them without CUDA headers; each returns a cudaError_t as int (0 = ok).
#pragma once
#include <cstdint>

#include "fls/common.h"

namespace fls {
namespace cuda {

// x, y: [rows, cols] dt; weight, bias: [cols] dt; mean, rstd: [rows] float32.
int layer_norm_fwd(DType dt, const void* x, const void* weight, const void* bias, void* y, float* mean, float* rstd,
                   int64_t rows, int64_t cols, double eps, void* stream);

// Floats of scratch memory layer_norm_bwd needs (per-block partial column sums).
int64_t layer_norm_bwd_workspace(int64_t rows, int64_t cols);

// dx: [rows, cols] dt; dweight, dbias: [cols] dt; workspace: layer_norm_bwd_workspace floats.
int layer_norm_bwd(DType dt, const void* dy, const void* x, const void* weight, const float* mean,
                   const float* rstd, void* dx, void* dweight, void* dbias, float* workspace, int64_t rows,
                   int64_t cols, void* stream);

}  // namespace cuda
}  // namespace fls
