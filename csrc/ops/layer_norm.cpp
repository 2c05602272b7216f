// Op wrapper of the layer-norm family: schema, argument checks, allocation, CPU/CUDA dispatch.
#include "../cpu/layer_norm.h"
#include "../cuda/layer_norm.h"
#include "utils.h"

namespace fls {
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_fwd(const at::Tensor& x, const at::Tensor& weight,
                                                              const at::Tensor& bias, double eps) {
  check_float(x, "layer_norm: x");
  check_same(weight, x, "layer_norm: weight", "x");
  check_same(bias, x, "layer_norm: bias", "x");
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) > 0, "layer_norm: x must have a non-empty last dimension, got shape ",
              x.sizes());
  const int64_t cols = x.size(-1);
  check_shape(weight, {cols}, "layer_norm: weight");
  check_shape(bias, {cols}, "layer_norm: bias");
  TORCH_CHECK(eps > 0, "layer_norm: eps must be > 0, got ", eps);
  const auto xc = x.contiguous();
  const int64_t rows = xc.numel() / cols;
  auto y = at::empty_like(xc);
  const auto stat_type = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  auto mean = at::empty({rows}, x.options().dtype(stat_type));
  auto rstd = at::empty({rows}, x.options().dtype(stat_type));
  if (x.is_cuda()) {
#ifdef FLS_WITH_CUDA
    const c10::cuda::CUDAGuard guard(x.device());
    TORCH_CHECK(rows <= 2147483647LL, "layer_norm: at most 2^31-1 rows on CUDA, got ", rows);
    FLS_CHECK_LAUNCH(cuda::layer_norm_fwd(to_dtype(x.scalar_type()), xc.data_ptr(), weight.contiguous().data_ptr(),
                                          bias.contiguous().data_ptr(), y.data_ptr(), mean.data_ptr<float>(),
                                          rstd.data_ptr<float>(), rows, cols, eps, current_stream(x)));
#endif
  } else {
    AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "layer_norm_fwd", [&] {
      using A = cpu::acc_t<scalar_t>;
      cpu::layer_norm_fwd<scalar_t>(xc.data_ptr<scalar_t>(), weight.contiguous().data_ptr<scalar_t>(),
                                    bias.contiguous().data_ptr<scalar_t>(), y.data_ptr<scalar_t>(),
                                    mean.data_ptr<A>(), rstd.data_ptr<A>(), rows, cols, eps);
    });
  }
  return {y, mean, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_bwd(const at::Tensor& dy, const at::Tensor& x,
                                                              const at::Tensor& weight, const at::Tensor& mean,
                                                              const at::Tensor& rstd) {
  check_float(x, "layer_norm_bwd: x");
  check_same(dy, x, "layer_norm_bwd: dy", "x");
  check_same(weight, x, "layer_norm_bwd: weight", "x");
  check_shape(dy, x.sizes(), "layer_norm_bwd: dy");
  const int64_t cols = x.size(-1);
  const int64_t rows = x.numel() / cols;
  check_shape(weight, {cols}, "layer_norm_bwd: weight");
  check_shape(mean, {rows}, "layer_norm_bwd: mean");
  check_shape(rstd, {rows}, "layer_norm_bwd: rstd");
  const auto stat_type = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  TORCH_CHECK(mean.scalar_type() == stat_type && rstd.scalar_type() == stat_type,
              "layer_norm_bwd: mean and rstd must be ", stat_type);
  const auto xc = x.contiguous(), dyc = dy.contiguous(), wc = weight.contiguous();
  auto dx = at::empty_like(xc);
  auto dw = at::empty_like(wc);
  auto db = at::empty_like(wc);
  if (x.is_cuda()) {
#ifdef FLS_WITH_CUDA
    const c10::cuda::CUDAGuard guard(x.device());
    TORCH_CHECK(rows <= 64LL * 65535, "layer_norm_bwd: at most ", 64LL * 65535, " rows on CUDA, got ", rows);
    auto ws = at::empty({cuda::layer_norm_bwd_workspace(rows, cols)}, x.options().dtype(at::kFloat));
    FLS_CHECK_LAUNCH(cuda::layer_norm_bwd(to_dtype(x.scalar_type()), dyc.data_ptr(), xc.data_ptr(), wc.data_ptr(),
                                          mean.data_ptr<float>(), rstd.data_ptr<float>(), dx.data_ptr(),
                                          dw.data_ptr(), db.data_ptr(), ws.data_ptr<float>(), rows, cols,
                                          current_stream(x)));
#endif
  } else {
    AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "layer_norm_bwd", [&] {
      using A = cpu::acc_t<scalar_t>;
      cpu::layer_norm_bwd<scalar_t>(dyc.data_ptr<scalar_t>(), xc.data_ptr<scalar_t>(), wc.data_ptr<scalar_t>(),
                                    mean.data_ptr<A>(), rstd.data_ptr<A>(), dx.data_ptr<scalar_t>(),
                                    dw.data_ptr<scalar_t>(), db.data_ptr<scalar_t>(), rows, cols);
    });
  }
  return {dx, dw, db};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(fairseq_lightseq, m) {
  m.def("layer_norm_fwd(Tensor x, Tensor weight, Tensor bias, float eps) -> (Tensor y, Tensor mean, Tensor rstd)");
  m.def(
      "layer_norm_bwd(Tensor dy, Tensor x, Tensor weight, Tensor mean, Tensor rstd) -> (Tensor dx, Tensor dweight, "
      "Tensor dbias)");
}

TORCH_LIBRARY_IMPL(fairseq_lightseq, CPU, m) {
  m.impl("layer_norm_fwd", &layer_norm_fwd);
  m.impl("layer_norm_bwd", &layer_norm_bwd);
}

#ifdef FLS_WITH_CUDA
TORCH_LIBRARY_IMPL(fairseq_lightseq, CUDA, m) {
  m.impl("layer_norm_fwd", &layer_norm_fwd);
  m.impl("layer_norm_bwd", &layer_norm_bwd);
}
#endif

}  // namespace fls
