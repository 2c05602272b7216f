// Op layer of the dropout family: bias+dropout+residual, bias+activation+dropout and the raw Philox keep
// mask. Argument checks and output allocation, shared by the CPU and CUDA implementations
// (csrc/ops/cpu_ops.cpp, csrc/ops/cuda/cuda_ops.cpp).
//
// Backward ops take (p, seed, offset) instead of a saved mask: the kernels regenerate the mask from the
// Philox stream (fls/philox.h), which costs a few integer ops per element and saves storing and re-reading
// a [rows, cols] mask.
#pragma once
#include <string>

#include "../kernels/dropout.h"
#include "utils.h"

namespace fls {

inline Act parse_act(c10::string_view act, const char* op) {
  if (act == "relu") return Act::kRelu;
  if (act == "gelu") return Act::kGelu;
  if (act == "gelu_tanh") return Act::kGeluTanh;
  TORCH_CHECK(false, op, ": act must be one of relu, gelu, gelu_tanh, got '", std::string(act), "'");
}

// Checks x [..., C] and bias [C]; returns C.
inline int64_t check_x_bias(const at::Tensor& x, const at::Tensor& bias, const char* op) {
  check_float(x, (std::string(op) + ": x").c_str());
  check_same(bias, x, (std::string(op) + ": bias").c_str(), "x");
  TORCH_CHECK(x.dim() >= 1, op, ": x must have at least 1 dimension, got a scalar");
  const int64_t cols = x.size(-1);
  check_shape(bias, {cols}, (std::string(op) + ": bias").c_str());
  return cols;
}

// One forward call of either op: y = residual + dropout(act(x + bias)).
struct BiasActDropoutFwd {
  at::Tensor x, bias, residual;  // residual undefined when absent
  at::Tensor y;
  BiasActDropoutFwdParams params;
};

inline BiasActDropoutFwd bias_act_fwd_prepare(const at::Tensor& x, const at::Tensor& bias,
                                              const c10::optional<at::Tensor>& residual, Act act, double p,
                                              int64_t seed, int64_t offset, const char* op) {
  const int64_t cols = check_x_bias(x, bias, op);
  if (residual) {
    check_same(*residual, x, (std::string(op) + ": residual").c_str(), "x");
    check_shape(*residual, x.sizes(), (std::string(op) + ": residual").c_str());
  }
  const DropoutParams d = make_dropout(p, seed, offset);
  BiasActDropoutFwd f;
  f.x = x.contiguous();
  f.bias = bias.contiguous();
  if (residual) f.residual = residual->contiguous();
  f.y = at::empty_like(f.x);
  f.params = {.dtype = to_dtype(x.scalar_type()), .x = f.x.data_ptr(), .bias = f.bias.data_ptr(),
              .residual = residual ? f.residual.data_ptr() : nullptr, .y = f.y.data_ptr(),
              .rows = cols == 0 ? 0 : f.x.numel() / cols, .cols = cols, .act = act, .drop = d};
  return f;
}

inline BiasActDropoutFwd bias_dropout_residual_fwd_prepare(const at::Tensor& x, const at::Tensor& bias,
                                                           const at::Tensor& residual, double p, int64_t seed,
                                                           int64_t offset) {
  return bias_act_fwd_prepare(x, bias, residual, Act::kIdentity, p, seed, offset, "bias_dropout_residual");
}

inline BiasActDropoutFwd bias_act_dropout_fwd_prepare(const at::Tensor& x, const at::Tensor& bias, double p,
                                                      c10::string_view act, int64_t seed, int64_t offset) {
  const Act a = parse_act(act, "bias_act_dropout");
  return bias_act_fwd_prepare(x, bias, c10::nullopt, a, p, seed, offset, "bias_act_dropout");
}

// One backward call: dx = dy * mask * scale * act'(x + bias) and dbias = column sums of dx. x and bias are
// undefined for the identity activation (only dy's shape and dtype are needed then).
struct BiasActDropoutBwd {
  at::Tensor dy, x, bias;
  at::Tensor dx, dbias;
  BiasActDropoutBwdParams params;
};

inline BiasActDropoutBwd bias_act_bwd_prepare(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& bias,
                                              int64_t cols, Act act, double p, int64_t seed, int64_t offset) {
  BiasActDropoutBwd b;
  const DropoutParams d = make_dropout(p, seed, offset);
  b.dy = dy.contiguous();
  if (x.defined()) b.x = x.contiguous();
  if (bias.defined()) b.bias = bias.contiguous();
  b.dx = at::empty_like(b.dy);
  b.dbias = at::empty({cols}, dy.options());
  b.params = {.dtype = to_dtype(dy.scalar_type()), .dy = b.dy.data_ptr(),
              .x = b.x.defined() ? b.x.data_ptr() : nullptr, .bias = b.bias.defined() ? b.bias.data_ptr() : nullptr,
              .dx = b.dx.data_ptr(), .dbias = b.dbias.data_ptr(), .rows = cols == 0 ? 0 : b.dy.numel() / cols,
              .cols = cols, .act = act, .drop = d};
  return b;
}

inline BiasActDropoutBwd bias_dropout_residual_bwd_prepare(const at::Tensor& dy, double p, int64_t seed,
                                                           int64_t offset) {
  const char* op = "bias_dropout_residual_bwd";
  check_float(dy, "bias_dropout_residual_bwd: dy");
  TORCH_CHECK(dy.dim() >= 1, op, ": dy must have at least 1 dimension, got a scalar");
  return bias_act_bwd_prepare(dy, at::Tensor(), at::Tensor(), dy.size(-1), Act::kIdentity, p, seed, offset);
}

inline BiasActDropoutBwd bias_act_dropout_bwd_prepare(const at::Tensor& dy, const at::Tensor& x,
                                                      const at::Tensor& bias, double p, c10::string_view act,
                                                      int64_t seed, int64_t offset) {
  const char* op = "bias_act_dropout_bwd";
  const Act a = parse_act(act, op);
  const int64_t cols = check_x_bias(x, bias, op);
  check_same(dy, x, "bias_act_dropout_bwd: dy", "x");
  check_shape(dy, x.sizes(), "bias_act_dropout_bwd: dy");
  return bias_act_bwd_prepare(dy, x, bias, cols, a, p, seed, offset);
}

// One dropout_mask call: keep[e] for stream elements offset .. offset+numel-1 of the draw (p, seed), the
// bits every dropout op of the library uses; exposed so tests can compare them with the reference generator.
struct DropoutMask {
  at::Tensor keep;
  DropoutMaskParams params;
};

inline DropoutMask dropout_mask_prepare(int64_t numel, double p, int64_t seed, int64_t offset, at::Device device) {
  TORCH_CHECK(numel >= 0, "dropout_mask: numel must be >= 0, got ", numel);
  const DropoutParams d = make_dropout(p, seed, offset);
  TORCH_CHECK(device.is_cpu() || device.is_cuda(), "dropout_mask: device must be CPU or CUDA, got ", device);
  DropoutMask m;
  m.keep = at::empty({numel}, at::TensorOptions().dtype(at::kBool).device(device));
  m.params = {.keep = m.keep.data_ptr<bool>(), .n = numel, .drop = d};
  return m;
}

// dropout_mask has no tensor argument for the dispatcher to choose a device by: one kernel registered
// under CompositeExplicitAutograd (csrc/ops/cpu_ops.cpp) serves every device and runs the CUDA draw through
// this pointer, which the CUDA registration (csrc/ops/cuda/cuda_ops.cpp) sets when the library loads. It
// stays null in a CPU-only build.
using DropoutMaskImpl = void (*)(const DropoutMask&);
inline DropoutMaskImpl& cuda_dropout_mask_impl() {
  static DropoutMaskImpl impl = nullptr;
  return impl;
}

}  // namespace fls
