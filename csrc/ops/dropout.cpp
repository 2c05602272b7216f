// Op layer of the dropout family: bias+dropout+residual, bias+activation+dropout and the raw Philox keep
// mask. The ops' schemas; per op, the argument checks and output allocation both devices share
// (<op>_prepare), then the CPU and the CUDA implementation, each registered under its own dispatch key.
//
// Backward ops take (p, seed, offset, rows) instead of a saved mask: the kernels regenerate the mask from the
// Philox stream (fls/philox.h), which costs a few integer ops per element and saves storing and re-reading
// a [rows, cols] mask. `rows` (optional, int64 [rows]) is the row map of packed rows (kernels/dropout.h).
#include <c10/util/accumulate.h>

#include <string>

#include "../kernels/dropout.h"
#include "device.h"

namespace fls {
namespace {

inline Act parse_act(c10::string_view act, const char* op) {
  if (act == "relu") return Act::kRelu;
  if (act == "gelu") return Act::kGelu;
  if (act == "gelu_tanh") return Act::kGeluTanh;
  TORCH_CHECK(false, op, ": act must be one of relu, gelu, gelu_tanh, got '", std::string(act), "'");
}

// Rows of x [..., C] read as [rows, C] (the row count a row map must have).
inline int64_t row_count(const at::Tensor& x) { return c10::multiply_integers(x.sizes().slice(0, x.dim() - 1)); }

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
  at::Tensor rows;               // the row map, undefined without one
  at::Tensor y;
  BiasActDropoutFwdParams params;
};

inline BiasActDropoutFwd bias_act_fwd_prepare(const at::Tensor& x, const at::Tensor& bias,
                                              const c10::optional<at::Tensor>& residual, Act act, double p,
                                              int64_t seed, int64_t offset, const c10::optional<at::Tensor>& rows,
                                              const char* op) {
  const int64_t cols = check_x_bias(x, bias, op);
  if (residual) {
    check_same(*residual, x, (std::string(op) + ": residual").c_str(), "x");
    check_shape(*residual, x.sizes(), (std::string(op) + ": residual").c_str());
  }
  const DropoutParams d = make_dropout(p, seed, offset);
  BiasActDropoutFwd f;
  f.rows = dropout_rows(rows, row_count(x), cols, d, x, op);
  f.x = x.contiguous();
  f.bias = bias.contiguous();
  if (residual) f.residual = residual->contiguous();
  f.y = at::empty_like(f.x);
  f.params = {.dtype = to_dtype(x.scalar_type()), .x = f.x.data_ptr(), .bias = f.bias.data_ptr(),
              .residual = residual ? f.residual.data_ptr() : nullptr, .y = f.y.data_ptr(),
              .rows = cols == 0 ? 0 : f.x.numel() / cols, .cols = cols, .act = act, .drop = d,
              .row_map = rows_ptr(f.rows)};
  return f;
}

inline BiasActDropoutFwd bias_dropout_residual_fwd_prepare(const at::Tensor& x, const at::Tensor& bias,
                                                           const at::Tensor& residual, double p, int64_t seed,
                                                           int64_t offset, const c10::optional<at::Tensor>& rows) {
  return bias_act_fwd_prepare(x, bias, residual, Act::kIdentity, p, seed, offset, rows, "bias_dropout_residual");
}

inline BiasActDropoutFwd bias_act_dropout_fwd_prepare(const at::Tensor& x, const at::Tensor& bias, double p,
                                                      c10::string_view act, int64_t seed, int64_t offset,
                                                      const c10::optional<at::Tensor>& rows) {
  const Act a = parse_act(act, "bias_act_dropout");
  return bias_act_fwd_prepare(x, bias, c10::nullopt, a, p, seed, offset, rows, "bias_act_dropout");
}

// One backward call: dx = dy * mask * scale * act'(x + bias) and dbias = column sums of dx. x and bias are
// undefined for the identity activation (only dy's shape and dtype are needed then).
struct BiasActDropoutBwd {
  at::Tensor dy, x, bias;
  at::Tensor rows;  // the row map, undefined without one
  at::Tensor dx, dbias;
  BiasActDropoutBwdParams params;
};

inline BiasActDropoutBwd bias_act_bwd_prepare(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& bias,
                                              int64_t cols, Act act, double p, int64_t seed, int64_t offset,
                                              const c10::optional<at::Tensor>& rows, const char* op) {
  BiasActDropoutBwd b;
  const DropoutParams d = make_dropout(p, seed, offset);
  b.rows = dropout_rows(rows, row_count(dy), cols, d, dy, op);
  b.dy = dy.contiguous();
  if (x.defined()) b.x = x.contiguous();
  if (bias.defined()) b.bias = bias.contiguous();
  b.dx = at::empty_like(b.dy);
  b.dbias = at::empty({cols}, dy.options());
  b.params = {.dtype = to_dtype(dy.scalar_type()), .dy = b.dy.data_ptr(),
              .x = b.x.defined() ? b.x.data_ptr() : nullptr, .bias = b.bias.defined() ? b.bias.data_ptr() : nullptr,
              .dx = b.dx.data_ptr(), .dbias = b.dbias.data_ptr(), .rows = cols == 0 ? 0 : b.dy.numel() / cols,
              .cols = cols, .act = act, .drop = d, .row_map = rows_ptr(b.rows)};
  return b;
}

inline BiasActDropoutBwd bias_dropout_residual_bwd_prepare(const at::Tensor& dy, double p, int64_t seed,
                                                           int64_t offset, const c10::optional<at::Tensor>& rows) {
  const char* op = "bias_dropout_residual_bwd";
  check_float(dy, "bias_dropout_residual_bwd: dy");
  TORCH_CHECK(dy.dim() >= 1, op, ": dy must have at least 1 dimension, got a scalar");
  return bias_act_bwd_prepare(dy, at::Tensor(), at::Tensor(), dy.size(-1), Act::kIdentity, p, seed, offset, rows,
                              op);
}

inline BiasActDropoutBwd bias_act_dropout_bwd_prepare(const at::Tensor& dy, const at::Tensor& x,
                                                      const at::Tensor& bias, double p, c10::string_view act,
                                                      int64_t seed, int64_t offset,
                                                      const c10::optional<at::Tensor>& rows) {
  const char* op = "bias_act_dropout_bwd";
  const Act a = parse_act(act, op);
  const int64_t cols = check_x_bias(x, bias, op);
  check_same(dy, x, "bias_act_dropout_bwd: dy", "x");
  check_shape(dy, x.sizes(), "bias_act_dropout_bwd: dy");
  return bias_act_bwd_prepare(dy, x, bias, cols, a, p, seed, offset, rows, op);
}

// One dropout_mask call: keep[e] for stream elements offset .. offset+numel-1 of the draw (p, seed), the
// bits every dropout op of the library uses (ops.dropout's mask; tests compare it with the reference
// generator). With rows (int64 [R]) keep is R rows of cols (numel = R * cols), row r the bits of row rows[r].
struct DropoutMask {
  at::Tensor keep, rows;  // rows undefined without a row map
  DropoutMaskParams params;
};

inline DropoutMask dropout_mask_prepare(int64_t numel, double p, int64_t seed, int64_t offset, at::Device device,
                                        const c10::optional<at::Tensor>& rows, int64_t cols) {
  const char* op = "dropout_mask";
  TORCH_CHECK(numel >= 0, op, ": numel must be >= 0, got ", numel);
  const DropoutParams d = make_dropout(p, seed, offset);
  TORCH_CHECK(device.is_cpu() || device.is_cuda(), op, ": device must be CPU or CUDA, got ", device);
  DropoutMask m;
  m.keep = at::empty({numel}, at::TensorOptions().dtype(at::kBool).device(device));
  if (rows.has_value() && rows->defined()) {
    TORCH_CHECK(cols >= 0, op, ": cols must be >= 0, got ", cols);
    const int64_t count = cols > 0 ? numel / cols : rows->numel();
    TORCH_CHECK(count * cols == numel, op, ": numel ", numel, " is not a whole number of rows of ", cols);
    m.rows = dropout_rows(rows, count, cols, d, m.keep, op);
  }
  m.params = {.keep = m.keep.data_ptr<bool>(), .n = numel, .drop = d, .row_map = rows_ptr(m.rows), .cols = cols};
  return m;
}

// ---- CPU
at::Tensor bias_dropout_residual_fwd_cpu(const at::Tensor& x, const at::Tensor& bias, const at::Tensor& residual,
                                         double p, int64_t seed, int64_t offset,
                                         const c10::optional<at::Tensor>& rows) {
  auto op = bias_dropout_residual_fwd_prepare(x, bias, residual, p, seed, offset, rows);
  cpu::bias_act_dropout_fwd(op.params);
  return op.y;
}

std::tuple<at::Tensor, at::Tensor> bias_dropout_residual_bwd_cpu(const at::Tensor& dy, double p, int64_t seed,
                                                                 int64_t offset,
                                                                 const c10::optional<at::Tensor>& rows) {
  auto op = bias_dropout_residual_bwd_prepare(dy, p, seed, offset, rows);
  cpu::bias_act_dropout_bwd(op.params);
  return {op.dx, op.dbias};
}

at::Tensor bias_act_dropout_fwd_cpu(const at::Tensor& x, const at::Tensor& bias, double p, c10::string_view act,
                                    int64_t seed, int64_t offset, const c10::optional<at::Tensor>& rows) {
  auto op = bias_act_dropout_fwd_prepare(x, bias, p, act, seed, offset, rows);
  cpu::bias_act_dropout_fwd(op.params);
  return op.y;
}

std::tuple<at::Tensor, at::Tensor> bias_act_dropout_bwd_cpu(const at::Tensor& dy, const at::Tensor& x,
                                                            const at::Tensor& bias, double p, c10::string_view act,
                                                            int64_t seed, int64_t offset,
                                                            const c10::optional<at::Tensor>& rows) {
  auto op = bias_act_dropout_bwd_prepare(dy, x, bias, p, act, seed, offset, rows);
  cpu::bias_act_dropout_bwd(op.params);
  return {op.dx, op.dbias};
}

// ---- CUDA (registered only in a CUDA build)
at::Tensor bias_dropout_residual_fwd_cuda(const at::Tensor& x, const at::Tensor& bias, const at::Tensor& residual,
                                          double p, int64_t seed, int64_t offset,
                                          const c10::optional<at::Tensor>& rows) {
  const c10::DeviceGuard guard(x.device());
  auto op = bias_dropout_residual_fwd_prepare(x, bias, residual, p, seed, offset, rows);
  FLS_CHECK_LAUNCH(cuda::bias_act_dropout_fwd(op.params, stream_of(x)));
  return op.y;
}

std::tuple<at::Tensor, at::Tensor> bias_act_bwd(const BiasActDropoutBwd& op) {
  auto ws = workspace(cuda::bias_act_dropout_bwd_workspace(op.params.rows, op.params.cols), op.dy);
  FLS_CHECK_LAUNCH(cuda::bias_act_dropout_bwd(op.params, ws.data_ptr<float>(), stream_of(op.dy)));
  return {op.dx, op.dbias};
}

std::tuple<at::Tensor, at::Tensor> bias_dropout_residual_bwd_cuda(const at::Tensor& dy, double p, int64_t seed,
                                                                  int64_t offset,
                                                                  const c10::optional<at::Tensor>& rows) {
  const c10::DeviceGuard guard(dy.device());
  return bias_act_bwd(bias_dropout_residual_bwd_prepare(dy, p, seed, offset, rows));
}

at::Tensor bias_act_dropout_fwd_cuda(const at::Tensor& x, const at::Tensor& bias, double p, c10::string_view act,
                                     int64_t seed, int64_t offset, const c10::optional<at::Tensor>& rows) {
  const c10::DeviceGuard guard(x.device());
  auto op = bias_act_dropout_fwd_prepare(x, bias, p, act, seed, offset, rows);
  FLS_CHECK_LAUNCH(cuda::bias_act_dropout_fwd(op.params, stream_of(x)));
  return op.y;
}

std::tuple<at::Tensor, at::Tensor> bias_act_dropout_bwd_cuda(const at::Tensor& dy, const at::Tensor& x,
                                                             const at::Tensor& bias, double p, c10::string_view act,
                                                             int64_t seed, int64_t offset,
                                                             const c10::optional<at::Tensor>& rows) {
  const c10::DeviceGuard guard(dy.device());
  return bias_act_bwd(bias_act_dropout_bwd_prepare(dy, x, bias, p, act, seed, offset, rows));
}

// ---- dropout_mask: no tensor argument for the dispatcher to choose a device by, so one kernel for every
// device, registered under CompositeExplicitAutograd (not a catch-all def, so that a fake kernel can be
// registered for it), branching on `device`.
at::Tensor dropout_mask(int64_t numel, double p, int64_t seed, int64_t offset, at::Device device,
                        const c10::optional<at::Tensor>& rows, int64_t cols) {
  auto op = dropout_mask_prepare(numel, p, seed, offset, device, rows, cols);
  if (device.is_cpu() && !cuda_emulation_on()) {
    cpu::dropout_mask(op.params);
  } else {
    TORCH_CHECK(kWithCuda || cuda_emulation_on(),
                "dropout_mask: fairseq_lightseq was built without CUDA, cannot draw on ", device);
    const c10::DeviceGuard guard(op.keep.device());
    FLS_CHECK_LAUNCH(cuda::dropout_mask(op.params, stream_of(op.keep)));
  }
  return op.keep;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(fairseq_lightseq, m) {
  m.def(
      "bias_dropout_residual_fwd(Tensor x, Tensor bias, Tensor residual, float p, int seed, int offset, "
      "Tensor? rows=None) -> Tensor");
  m.def(
      "bias_dropout_residual_bwd(Tensor dy, float p, int seed, int offset, Tensor? rows=None) -> (Tensor dx, "
      "Tensor dbias)");
  m.def(
      "bias_act_dropout_fwd(Tensor x, Tensor bias, float p, str act, int seed, int offset, Tensor? rows=None) -> "
      "Tensor");
  m.def(
      "bias_act_dropout_bwd(Tensor dy, Tensor x, Tensor bias, float p, str act, int seed, int offset, "
      "Tensor? rows=None) -> (Tensor dx, Tensor dbias)");
  m.def(
      "dropout_mask(int numel, float p, int seed, int offset, Device device, Tensor? rows=None, int cols=0) -> "
      "Tensor");
}

TORCH_LIBRARY_IMPL(fairseq_lightseq, CPU, m) {
  m.impl("bias_dropout_residual_fwd", FLS_CPU_IMPL(bias_dropout_residual_fwd));
  m.impl("bias_dropout_residual_bwd", FLS_CPU_IMPL(bias_dropout_residual_bwd));
  m.impl("bias_act_dropout_fwd", FLS_CPU_IMPL(bias_act_dropout_fwd));
  m.impl("bias_act_dropout_bwd", FLS_CPU_IMPL(bias_act_dropout_bwd));
}

TORCH_LIBRARY_IMPL(fairseq_lightseq, CUDA, m) {
  if (!kWithCuda) return;
  m.impl("bias_dropout_residual_fwd", &bias_dropout_residual_fwd_cuda);
  m.impl("bias_dropout_residual_bwd", &bias_dropout_residual_bwd_cuda);
  m.impl("bias_act_dropout_fwd", &bias_act_dropout_fwd_cuda);
  m.impl("bias_act_dropout_bwd", &bias_act_dropout_bwd_cuda);
}

TORCH_LIBRARY_IMPL(fairseq_lightseq, CompositeExplicitAutograd, m) { m.impl("dropout_mask", &dropout_mask); }

}  // namespace fls
