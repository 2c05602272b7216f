// Kernel interface of the dropout family (bias + activation + dropout (+ residual), and the raw Philox keep
// mask): the params the op layer fills (csrc/ops/dropout.cpp) and the entry point of each device
// (csrc/cpu/dropout.cpp, csrc/cuda/dropout.cu). Plain C++, included by the CUDA file.
//
// Element e = r * cols + c of a [rows, cols] tensor uses Philox stream element drop.offset + e
// (fls/philox.h): backward regenerates the mask from (seed, offset) instead of reading a stored one.
// With a row map (row_map non-null: packed rows of a padded tensor, int64 [rows]), row r is row row_map[r]
// of the padded tensor: element (r, c) uses stream element drop.offset + row_map[r] * cols + c. The map
// only names stream elements (no memory is indexed by it); null is the identity.
#pragma once
#include <cstdint>

#include "fls/activations.h"
#include "fls/common.h"
#include "cuda_launcher.h"

namespace fls {

// keep[e] = Philox keep bit of stream element drop.offset + e, e in [0, n); with row_map, keep is
// [n / cols, cols] and keep[r * cols + c] the bit of drop.offset + row_map[r] * cols + c (cols > 0 then).
struct DropoutMaskParams {
  bool* keep;
  int64_t n;
  DropoutParams drop;
  const int64_t* row_map = nullptr;
  int64_t cols = 0;
};

// y = residual + dropout(act(x + bias)), or dropout(act(x + bias)) when residual is null (the residual
// form has no activation: act is kIdentity then). x, residual, y: [rows, cols] dtype; bias: [cols] dtype.
struct BiasActDropoutFwdParams {
  DType dtype;
  const void* x;
  const void* bias;
  const void* residual;
  void* y;
  int64_t rows, cols;
  Act act;
  DropoutParams drop;
  const int64_t* row_map = nullptr;  // [rows] or null (see the top of this file)
};

// dx = dy * dropout factor * act'(x + bias); dbias = column sums of dx in fp32 (taken before rounding dx
// to dtype), over fixed row chunks and then in a fixed order (deterministic). x and bias are not read for
// Act::kIdentity (may be null). dy, x, dx: [rows, cols] dtype; bias, dbias: [cols] dtype.
struct BiasActDropoutBwdParams {
  DType dtype;
  const void* dy;
  const void* x;
  const void* bias;
  void* dx;
  void* dbias;
  int64_t rows, cols;
  Act act;
  DropoutParams drop;
  const int64_t* row_map = nullptr;  // [rows] or null (see the top of this file)
};

namespace cpu {
void dropout_mask(const DropoutMaskParams& p);
void bias_act_dropout_fwd(const BiasActDropoutFwdParams& p);
void bias_act_dropout_bwd(const BiasActDropoutBwdParams& p);
}  // namespace cpu

// CUDA launchers return a cudaError_t as int (0 = ok).
namespace cuda {
FLS_CUDA_LAUNCHER int dropout_mask(const DropoutMaskParams& p, void* stream);
FLS_CUDA_LAUNCHER int bias_act_dropout_fwd(const BiasActDropoutFwdParams& p, void* stream);
// Floats of scratch memory bias_act_dropout_bwd needs (per-chunk partial column sums).
FLS_CUDA_LAUNCHER int64_t bias_act_dropout_bwd_workspace(int64_t rows, int64_t cols);
FLS_CUDA_LAUNCHER int bias_act_dropout_bwd(const BiasActDropoutBwdParams& p, float* workspace, void* stream);
}  // namespace cuda

}  // namespace fls
