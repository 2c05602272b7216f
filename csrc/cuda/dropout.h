// CUDA launchers of the dropout family (csrc/cuda/dropout.cu). Plain C++ declarations so the ATen
// wrapper can include them without CUDA headers; each returns a cudaError_t as int (0 = ok).
#pragma once
#include <cstdint>

#include "fls/activations.h"
#include "fls/common.h"

namespace fls {
namespace cuda {

// keep[e] = Philox keep bit of stream element d.offset + e, e in [0, n).
int dropout_mask(bool* keep, int64_t n, const DropoutParams& d, void* stream);

// y = residual + dropout(act(x + bias)) (residual may be null). x, residual, y: [rows, cols] dt; bias: [cols] dt.
int bias_act_dropout_fwd(DType dt, const void* x, const void* bias, const void* residual, void* y, int64_t rows,
                         int64_t cols, Act act, const DropoutParams& d, void* stream);

// Floats of scratch memory bias_act_dropout_bwd needs (per-chunk partial column sums).
int64_t bias_act_dropout_bwd_workspace(int64_t rows, int64_t cols);

// dx = dy * dropout factor (mask regenerated from d) * act'(x + bias); dbias = column sums of dx in
// fp32 (fixed row chunks, then a fixed-order sum). x, bias unused (may be null) for Act::kIdentity.
int bias_act_dropout_bwd(DType dt, const void* dy, const void* x, const void* bias, void* dx, void* dbias,
                         float* workspace, int64_t rows, int64_t cols, Act act, const DropoutParams& d, void* stream);

}  // namespace cuda
}  // namespace fls
