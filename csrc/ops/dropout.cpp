// Op wrapper of the dropout family: bias+dropout+residual, bias+activation+dropout and the raw
// Philox keep mask. Schema, argument checks, allocation, CPU/CUDA dispatch.
//
// Backward ops take (p, seed, offset) instead of a saved mask: they regenerate the mask from the
// Philox stream (fls/philox.h), which costs a few integer ops per element and saves storing and
// re-reading a [rows, cols] mask.
#include "../cpu/dropout.h"
#include "../cuda/dropout.h"
#include "utils.h"

namespace fls {
namespace {

Act parse_act(c10::string_view act, const char* op) {
  if (act == "relu") return Act::kRelu;
  if (act == "gelu") return Act::kGelu;
  if (act == "gelu_tanh") return Act::kGeluTanh;
  TORCH_CHECK(false, op, ": act must be one of relu, gelu, gelu_tanh, got '", std::string(act), "'");
}

// Checks x [..., C] and bias [C]; returns C.
int64_t check_x_bias(const at::Tensor& x, const at::Tensor& bias, const char* op) {
  check_float(x, (std::string(op) + ": x").c_str());
  check_same(bias, x, (std::string(op) + ": bias").c_str(), "x");
  TORCH_CHECK(x.dim() >= 1, op, ": x must have at least 1 dimension, got a scalar");
  const int64_t cols = x.size(-1);
  check_shape(bias, {cols}, (std::string(op) + ": bias").c_str());
  return cols;
}

at::Tensor bias_act_fwd(const at::Tensor& x, const at::Tensor& bias, const c10::optional<at::Tensor>& residual,
                        Act act, double p, int64_t seed, int64_t offset, const char* op) {
  const int64_t cols = check_x_bias(x, bias, op);
  if (residual) {
    check_same(*residual, x, (std::string(op) + ": residual").c_str(), "x");
    check_shape(*residual, x.sizes(), (std::string(op) + ": residual").c_str());
  }
  const DropoutParams d = make_dropout(p, seed, offset);
  const auto xc = x.contiguous(), bc = bias.contiguous();
  const at::Tensor rc = residual ? residual->contiguous() : at::Tensor();
  const int64_t rows = cols == 0 ? 0 : xc.numel() / cols;
  auto y = at::empty_like(xc);
  if (xc.numel() == 0) return y;
  if (x.is_cuda()) {
#ifdef FLS_WITH_CUDA
    const c10::cuda::CUDAGuard guard(x.device());
    FLS_CHECK_LAUNCH(cuda::bias_act_dropout_fwd(to_dtype(x.scalar_type()), xc.data_ptr(), bc.data_ptr(),
                                                residual ? rc.data_ptr() : nullptr, y.data_ptr(), rows, cols, act,
                                                d, current_stream(x)));
#endif
  } else {
    AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "bias_act_dropout_fwd", [&] {
      cpu::bias_act_dropout_fwd<scalar_t>(xc.data_ptr<scalar_t>(), bc.data_ptr<scalar_t>(),
                                          residual ? rc.data_ptr<scalar_t>() : nullptr, y.data_ptr<scalar_t>(),
                                          rows, cols, act, d);
    });
  }
  return y;
}

// dx = dy * mask * scale * act'(x + bias) and dbias = column sums of dx. x and bias are undefined
// tensors for the identity activation (only dy's shape and dtype are needed then).
std::tuple<at::Tensor, at::Tensor> bias_act_bwd(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& bias,
                                                int64_t cols, Act act, double p, int64_t seed, int64_t offset,
                                                const char* op) {
  const DropoutParams d = make_dropout(p, seed, offset);
  const auto dyc = dy.contiguous();
  const at::Tensor xc = x.defined() ? x.contiguous() : at::Tensor();
  const at::Tensor bc = bias.defined() ? bias.contiguous() : at::Tensor();
  const int64_t rows = cols == 0 ? 0 : dyc.numel() / cols;
  auto dx = at::empty_like(dyc);
  auto dbias = at::empty({cols}, dy.options());
  if (cols == 0) return {dx, dbias};
  if (dy.is_cuda()) {
#ifdef FLS_WITH_CUDA
    const c10::cuda::CUDAGuard guard(dy.device());
    auto ws = at::empty({cuda::bias_act_dropout_bwd_workspace(rows, cols)}, dy.options().dtype(at::kFloat));
    FLS_CHECK_LAUNCH(cuda::bias_act_dropout_bwd(to_dtype(dy.scalar_type()), dyc.data_ptr(),
                                                xc.defined() ? xc.data_ptr() : nullptr,
                                                bc.defined() ? bc.data_ptr() : nullptr, dx.data_ptr(),
                                                dbias.data_ptr(), ws.data_ptr<float>(), rows, cols, act, d,
                                                current_stream(dy)));
#endif
  } else {
    AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, dy.scalar_type(), "bias_act_dropout_bwd", [&] {
      cpu::bias_act_dropout_bwd<scalar_t>(dyc.data_ptr<scalar_t>(), xc.defined() ? xc.data_ptr<scalar_t>() : nullptr,
                                          bc.defined() ? bc.data_ptr<scalar_t>() : nullptr,
                                          dx.data_ptr<scalar_t>(), dbias.data_ptr<scalar_t>(), rows, cols, act, d);
    });
  }
  return {dx, dbias};
}

at::Tensor bias_dropout_residual_fwd(const at::Tensor& x, const at::Tensor& bias, const at::Tensor& residual,
                                     double p, int64_t seed, int64_t offset) {
  return bias_act_fwd(x, bias, residual, Act::kIdentity, p, seed, offset, "bias_dropout_residual");
}

std::tuple<at::Tensor, at::Tensor> bias_dropout_residual_bwd(const at::Tensor& dy, double p, int64_t seed,
                                                             int64_t offset) {
  const char* op = "bias_dropout_residual_bwd";
  check_float(dy, "bias_dropout_residual_bwd: dy");
  TORCH_CHECK(dy.dim() >= 1, op, ": dy must have at least 1 dimension, got a scalar");
  return bias_act_bwd(dy, at::Tensor(), at::Tensor(), dy.size(-1), Act::kIdentity, p, seed, offset, op);
}

at::Tensor bias_act_dropout_fwd(const at::Tensor& x, const at::Tensor& bias, double p, c10::string_view act,
                                int64_t seed, int64_t offset) {
  const Act a = parse_act(act, "bias_act_dropout");
  return bias_act_fwd(x, bias, c10::nullopt, a, p, seed, offset, "bias_act_dropout");
}

std::tuple<at::Tensor, at::Tensor> bias_act_dropout_bwd(const at::Tensor& dy, const at::Tensor& x,
                                                        const at::Tensor& bias, double p, c10::string_view act,
                                                        int64_t seed, int64_t offset) {
  const char* op = "bias_act_dropout_bwd";
  const Act a = parse_act(act, op);
  const int64_t cols = check_x_bias(x, bias, op);
  check_same(dy, x, "bias_act_dropout_bwd: dy", "x");
  check_shape(dy, x.sizes(), "bias_act_dropout_bwd: dy");
  return bias_act_bwd(dy, x, bias, cols, a, p, seed, offset, op);
}

// keep[e] for stream elements offset .. offset+numel-1 of the draw (p, seed): the bits every
// dropout op of the library uses; exposed so tests can compare them with the reference generator.
at::Tensor dropout_mask(int64_t numel, double p, int64_t seed, int64_t offset, at::Device device) {
  TORCH_CHECK(numel >= 0, "dropout_mask: numel must be >= 0, got ", numel);
  const DropoutParams d = make_dropout(p, seed, offset);
  auto keep = at::empty({numel}, at::TensorOptions().dtype(at::kBool).device(device));
  if (numel == 0) return keep;
  if (device.is_cuda()) {
#ifdef FLS_WITH_CUDA
    const c10::cuda::CUDAGuard guard(device);
    FLS_CHECK_LAUNCH(cuda::dropout_mask(keep.data_ptr<bool>(), numel, d, current_stream(keep)));
#else
    TORCH_CHECK(false, "dropout_mask: fairseq_lightseq was built without CUDA, cannot draw on ", device);
#endif
  } else {
    TORCH_CHECK(device.is_cpu(), "dropout_mask: device must be CPU or CUDA, got ", device);
    cpu::dropout_mask(keep.data_ptr<bool>(), numel, d);
  }
  return keep;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(fairseq_lightseq, m) {
  m.def(
      "bias_dropout_residual_fwd(Tensor x, Tensor bias, Tensor residual, float p, int seed, int offset) -> Tensor");
  m.def("bias_dropout_residual_bwd(Tensor dy, float p, int seed, int offset) -> (Tensor dx, Tensor dbias)");
  m.def("bias_act_dropout_fwd(Tensor x, Tensor bias, float p, str act, int seed, int offset) -> Tensor");
  m.def(
      "bias_act_dropout_bwd(Tensor dy, Tensor x, Tensor bias, float p, str act, int seed, int offset) -> (Tensor dx, "
      "Tensor dbias)");
  m.def("dropout_mask(int numel, float p, int seed, int offset, Device device) -> Tensor");
}

TORCH_LIBRARY_IMPL(fairseq_lightseq, CPU, m) {
  m.impl("bias_dropout_residual_fwd", &bias_dropout_residual_fwd);
  m.impl("bias_dropout_residual_bwd", &bias_dropout_residual_bwd);
  m.impl("bias_act_dropout_fwd", &bias_act_dropout_fwd);
  m.impl("bias_act_dropout_bwd", &bias_act_dropout_bwd);
}

// No tensor argument to dispatch on: one kernel for every backend, branching on `device`.
// CompositeExplicitAutograd (not a catch-all def) so that a fake kernel can be registered for it.
TORCH_LIBRARY_IMPL(fairseq_lightseq, CompositeExplicitAutograd, m) { m.impl("dropout_mask", &dropout_mask); }

#ifdef FLS_WITH_CUDA
TORCH_LIBRARY_IMPL(fairseq_lightseq, CUDA, m) {
  m.impl("bias_dropout_residual_fwd", &bias_dropout_residual_fwd);
  m.impl("bias_dropout_residual_bwd", &bias_dropout_residual_bwd);
  m.impl("bias_act_dropout_fwd", &bias_act_dropout_fwd);
  m.impl("bias_act_dropout_bwd", &bias_act_dropout_bwd);
}
#endif

}  // namespace fls
