// Kernel interface of the label-smoothed cross-entropy family (formulas in fls/label_smoothing.h): the
// params the op layer fills (csrc/ops/cross_entropy.cpp) and the entry point of each device
// (csrc/cpu/cross_entropy.cpp, csrc/cuda/cross_entropy.cu). Plain C++, included by the CUDA file.
#pragma once
#include <cstdint>

#include "fls/common.h"
#include "cuda_launcher.h"

namespace fls {

// Per row of logits [rows, V] dtype with target [rows] int64: loss, nll, lse: [rows] acc (float64 for
// kFloat64, else float32). Rows whose target == ignore_index get 0 and are not read. Targets must already
// be checked to lie in [0, V) or equal ignore_index.
struct LsCrossEntropyFwdParams {
  DType dtype;
  const void* logits;
  const int64_t* target;
  void* loss;
  void* nll;
  void* lse;
  int64_t rows, V;
  double epsilon;
  int64_t ignore_index;
};

// dlogits [rows, V] dtype from the upstream gradients dloss, dnll: [rows] acc and the saved lse [rows] acc;
// zero rows where target == ignore_index. dlogits may alias logits (each element is read before it is
// written, by the same thread).
struct LsCrossEntropyBwdParams {
  DType dtype;
  const void* dloss;
  const void* dnll;
  const void* logits;
  const int64_t* target;
  const void* lse;
  void* dlogits;
  int64_t rows, V;
  double epsilon;
  int64_t ignore_index;
};

namespace cpu {
void ls_cross_entropy_fwd(const LsCrossEntropyFwdParams& p);
void ls_cross_entropy_bwd(const LsCrossEntropyBwdParams& p);
}  // namespace cpu

// CUDA launchers return a cudaError_t as int (0 = ok).
namespace cuda {
FLS_CUDA_LAUNCHER int ls_cross_entropy_fwd(const LsCrossEntropyFwdParams& p, void* stream);
FLS_CUDA_LAUNCHER int ls_cross_entropy_bwd(const LsCrossEntropyBwdParams& p, void* stream);
}  // namespace cuda

}  // namespace fls
