// CUDA launchers of the label-smoothed cross-entropy family (csrc/cuda/cross_entropy.cu). Plain
// C++ declarations; each returns a cudaError_t as int (0 = ok). Formulas: fls/label_smoothing.h.
#pragma once
#include <cstdint>

#include "fls/common.h"

namespace fls {
namespace cuda {

// logits: [rows, V] dt; target: [rows] int64 (checked: in [0, V) or ignore_index);
// loss, nll, lse: [rows] float32 (0 for ignored rows).
int ls_cross_entropy_fwd(DType dt, const void* logits, const int64_t* target, float* loss, float* nll, float* lse,
                         int64_t rows, int64_t V, double epsilon, int64_t ignore_index, void* stream);

// dlogits: [rows, V] dt (may alias logits); dloss, dnll, lse: [rows] float32.
int ls_cross_entropy_bwd(DType dt, const float* dloss, const float* dnll, const void* logits, const int64_t* target,
                         const float* lse, void* dlogits, int64_t rows, int64_t V, double epsilon,
                         int64_t ignore_index, void* stream);

}  // namespace cuda
}  // namespace fls
