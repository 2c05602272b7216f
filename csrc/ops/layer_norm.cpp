// Op layer of the layer-norm family: the ops' schemas; per op, the argument checks and output allocation
// both devices share (<op>_prepare), then the CPU and the CUDA implementation, each registered under its
// own dispatch key, which run the kernels (csrc/kernels/layer_norm.h) on the params filled here.
#include "../kernels/layer_norm.h"
#include "device.h"

namespace fls {
namespace {

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
  at::Tensor dy, x, weight, mean, rstd;
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
  TORCH_CHECK(mean.device() == x.device() && rstd.device() == x.device(), "layer_norm_bwd: mean and rstd must be on ",
              x.device(), " (x's device), got ", mean.device(), " and ", rstd.device());
  LayerNormBwd op;
  op.mean = mean.contiguous();
  op.rstd = rstd.contiguous();
  op.x = x.contiguous();
  op.dy = dy.contiguous();
  op.weight = weight.contiguous();
  op.dx = at::empty_like(op.x);
  op.dweight = at::empty_like(op.weight);
  op.dbias = at::empty_like(op.weight);
  op.params = {.dtype = to_dtype(x.scalar_type()), .dy = op.dy.data_ptr(), .x = op.x.data_ptr(),
               .weight = op.weight.data_ptr(), .mean = op.mean.data_ptr(), .rstd = op.rstd.data_ptr(),
               .dx = op.dx.data_ptr(), .dweight = op.dweight.data_ptr(), .dbias = op.dbias.data_ptr(),
               .rows = rows, .cols = cols};
  return op;
}

// ---- CPU
std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_fwd_cpu(const at::Tensor& x, const at::Tensor& weight,
                                                                  const at::Tensor& bias, double eps) {
  auto op = layer_norm_fwd_prepare(x, weight, bias, eps);
  cpu::layer_norm_fwd(op.params);
  return {op.y, op.mean, op.rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_bwd_cpu(const at::Tensor& dy, const at::Tensor& x,
                                                                  const at::Tensor& weight, const at::Tensor& mean,
                                                                  const at::Tensor& rstd) {
  auto op = layer_norm_bwd_prepare(dy, x, weight, mean, rstd);
  cpu::layer_norm_bwd(op.params);
  return {op.dx, op.dweight, op.dbias};
}

// ---- CUDA (registered only in a CUDA build)
std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_fwd_cuda(const at::Tensor& x, const at::Tensor& weight,
                                                                   const at::Tensor& bias, double eps) {
  const c10::DeviceGuard guard(x.device());
  auto op = layer_norm_fwd_prepare(x, weight, bias, eps);
  TORCH_CHECK(op.params.rows <= kMaxRows32, "layer_norm: at most 2^31-1 rows on CUDA, got ", op.params.rows);
  FLS_CHECK_LAUNCH(cuda::layer_norm_fwd(op.params, stream_of(x)));
  return {op.y, op.mean, op.rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_bwd_cuda(const at::Tensor& dy, const at::Tensor& x,
                                                                   const at::Tensor& weight, const at::Tensor& mean,
                                                                   const at::Tensor& rstd) {
  const c10::DeviceGuard guard(x.device());
  auto op = layer_norm_bwd_prepare(dy, x, weight, mean, rstd);
  const int64_t rows = op.params.rows;
  TORCH_CHECK(rows <= kMaxRows32, "layer_norm_bwd: at most 2^31-1 rows on CUDA, got ", rows);
  auto ws = workspace(cuda::layer_norm_bwd_workspace(rows, op.params.cols), x);
  FLS_CHECK_LAUNCH(cuda::layer_norm_bwd(op.params, ws.data_ptr<float>(), stream_of(x)));
  return {op.dx, op.dweight, op.dbias};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(fairseq_lightseq, m) {
  m.def("layer_norm_fwd(Tensor x, Tensor weight, Tensor bias, float eps) -> (Tensor y, Tensor mean, Tensor rstd)");
  m.def(
      "layer_norm_bwd(Tensor dy, Tensor x, Tensor weight, Tensor mean, Tensor rstd) -> (Tensor dx, Tensor dweight, "
      "Tensor dbias)");
}

TORCH_LIBRARY_IMPL(fairseq_lightseq, CPU, m) {
  m.impl("layer_norm_fwd", FLS_CPU_IMPL(layer_norm_fwd));
  m.impl("layer_norm_bwd", FLS_CPU_IMPL(layer_norm_bwd));
}

TORCH_LIBRARY_IMPL(fairseq_lightseq, CUDA, m) {
  if (!kWithCuda) return;
  m.impl("layer_norm_fwd", &layer_norm_fwd_cuda);
  m.impl("layer_norm_bwd", &layer_norm_bwd_cuda);
}

}  // namespace fls
