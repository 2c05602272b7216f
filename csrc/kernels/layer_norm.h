// Kernel interface of the layer-norm family: the params the op layer fills (csrc/ops/layer_norm.cpp) and
// the entry point of each device (csrc/cpu/layer_norm.cpp, csrc/cuda/layer_norm.cu). Plain C++: the CUDA
// file includes it and compiles with `nvcc -c` alone.
#pragma once
#include <cstdint>

#include "fls/common.h"
#include "cuda_launcher.h"

namespace fls {

// y = (x - mean) * rstd * weight + bias over the last dimension.
// x, y: [rows, cols] dtype; weight, bias: [cols] dtype; mean, rstd: [rows] acc (float64 for kFloat64, else
// float32), saved for backward.
struct LayerNormFwdParams {
  DType dtype;
  const void* x;
  const void* weight;
  const void* bias;
  void* y;
  void* mean;
  void* rstd;
  int64_t rows, cols;
  double eps;
};

// dx: [rows, cols] dtype; dweight, dbias: [cols] dtype, column sums taken in a fixed order (the result
// does not depend on the thread count or timing). mean, rstd: the forward's.
struct LayerNormBwdParams {
  DType dtype;
  const void* dy;
  const void* x;
  const void* weight;
  const void* mean;
  const void* rstd;
  void* dx;
  void* dweight;
  void* dbias;
  int64_t rows, cols;
};

namespace cpu {
void layer_norm_fwd(const LayerNormFwdParams& p);
void layer_norm_bwd(const LayerNormBwdParams& p);
}  // namespace cpu

// CUDA launchers return a cudaError_t as int (0 = ok), so that this header stays free of CUDA.
namespace cuda {
FLS_CUDA_LAUNCHER int layer_norm_fwd(const LayerNormFwdParams& p, void* stream);
// Floats of scratch memory layer_norm_bwd needs (per-chunk partial column sums).
FLS_CUDA_LAUNCHER int64_t layer_norm_bwd_workspace(int64_t rows, int64_t cols);
FLS_CUDA_LAUNCHER int layer_norm_bwd(const LayerNormBwdParams& p, float* workspace, void* stream);
}  // namespace cuda

}  // namespace fls
