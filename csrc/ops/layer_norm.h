// Op layer of the layer-norm family: argument checks and output allocation, shared by the CPU and CUDA
// implementations (csrc/ops/cpu_ops.cpp, csrc/ops/cuda/cuda_ops.cpp), which then run the kernels on the
// params filled here.
#pragma once
#include "../kernels/layer_norm.h"
#include "utils.h"

namespace fls {

// One layer_norm_fwd call: contiguous inputs (kept alive until the kernel ran), outputs, kernel params.
struct LayerNormFwd {
  at::Tensor x, weight, bias;
  at::Tensor y, mean, rstd;
  LayerNormFwdParams params;
};

inline LayerNormFwd layer_norm_fwd_prepare(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                                           double eps) {
  check_float(x, "layer_norm: x");
  check_same(weight, x, "layer_norm: weight", "x");
  check_same(bias, x, "layer_norm: bias", "x");
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) > 0, "layer_norm: x must have a non-empty last dimension, got shape ",
              x.sizes());
  const int64_t cols = x.size(-1);
  check_shape(weight, {cols}, "layer_norm: weight");
  check_shape(bias, {cols}, "layer_norm: bias");
  TORCH_CHECK(eps > 0, "layer_norm: eps must be > 0, got ", eps);
  LayerNormFwd op;
  op.x = x.contiguous();
  op.weight = weight.contiguous();
  op.bias = bias.contiguous();
  const int64_t rows = op.x.numel() / cols;
  op.y = at::empty_like(op.x);
  op.mean = at::empty({rows}, x.options().dtype(acc_type(x)));
  op.rstd = at::empty({rows}, x.options().dtype(acc_type(x)));
  op.params = {.dtype = to_dtype(x.scalar_type()), .x = op.x.data_ptr(), .weight = op.weight.data_ptr(),
               .bias = op.bias.data_ptr(), .y = op.y.data_ptr(), .mean = op.mean.data_ptr(),
               .rstd = op.rstd.data_ptr(), .rows = rows, .cols = cols, .eps = eps};
  return op;
}

// One layer_norm_bwd call.
struct LayerNormBwd {
  at::Tensor dy, x, weight;
  at::Tensor dx, dweight, dbias;
  LayerNormBwdParams params;
};

inline LayerNormBwd layer_norm_bwd_prepare(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& weight,
                                           const at::Tensor& mean, const at::Tensor& rstd) {
  check_float(x, "layer_norm_bwd: x");
  check_same(dy, x, "layer_norm_bwd: dy", "x");
  check_same(weight, x, "layer_norm_bwd: weight", "x");
  check_shape(dy, x.sizes(), "layer_norm_bwd: dy");
  const int64_t cols = x.size(-1);
  const int64_t rows = x.numel() / cols;
  check_shape(weight, {cols}, "layer_norm_bwd: weight");
  check_shape(mean, {rows}, "layer_norm_bwd: mean");
  check_shape(rstd, {rows}, "layer_norm_bwd: rstd");
  TORCH_CHECK(mean.scalar_type() == acc_type(x) && rstd.scalar_type() == acc_type(x),
              "layer_norm_bwd: mean and rstd must be ", acc_type(x));
  LayerNormBwd op;
  op.x = x.contiguous();
  op.dy = dy.contiguous();
  op.weight = weight.contiguous();
  op.dx = at::empty_like(op.x);
  op.dweight = at::empty_like(op.weight);
  op.dbias = at::empty_like(op.weight);
  op.params = {.dtype = to_dtype(x.scalar_type()), .dy = op.dy.data_ptr(), .x = op.x.data_ptr(),
               .weight = op.weight.data_ptr(), .mean = mean.data_ptr(), .rstd = rstd.data_ptr(),
               .dx = op.dx.data_ptr(), .dweight = op.dweight.data_ptr(), .dbias = op.dbias.data_ptr(),
               .rows = rows, .cols = cols};
  return op;
}

}  // namespace fls
