// Every op of the library: its schema (TORCH_LIBRARY), and its CPU implementation registered under the CPU
// dispatch key. Each implementation is the family's check-and-allocate function (csrc/ops/<family>.h),
// then the CPU kernel (csrc/cpu/<family>.cpp) on the params it filled. The CUDA implementations are
// registered by csrc/ops/cuda/cuda_ops.cpp, compiled only in a CUDA build.
#include "adam.h"
#include "attention.h"
#include "cross_entropy.h"
#include "dropout.h"
#include "embedding.h"
#include "layer_norm.h"
#include "op_list.h"

namespace fls {
namespace {

// ---- layer norm
std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_fwd(const at::Tensor& x, const at::Tensor& weight,
                                                              const at::Tensor& bias, double eps) {
  auto op = layer_norm_fwd_prepare(x, weight, bias, eps);
  cpu::layer_norm_fwd(op.params);
  return {op.y, op.mean, op.rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_bwd(const at::Tensor& dy, const at::Tensor& x,
                                                              const at::Tensor& weight, const at::Tensor& mean,
                                                              const at::Tensor& rstd) {
  auto op = layer_norm_bwd_prepare(dy, x, weight, mean, rstd);
  cpu::layer_norm_bwd(op.params);
  return {op.dx, op.dweight, op.dbias};
}

// ---- dropout
at::Tensor bias_dropout_residual_fwd(const at::Tensor& x, const at::Tensor& bias, const at::Tensor& residual,
                                     double p, int64_t seed, int64_t offset) {
  auto op = bias_dropout_residual_fwd_prepare(x, bias, residual, p, seed, offset);
  cpu::bias_act_dropout_fwd(op.params);
  return op.y;
}

std::tuple<at::Tensor, at::Tensor> bias_dropout_residual_bwd(const at::Tensor& dy, double p, int64_t seed,
                                                             int64_t offset) {
  auto op = bias_dropout_residual_bwd_prepare(dy, p, seed, offset);
  cpu::bias_act_dropout_bwd(op.params);
  return {op.dx, op.dbias};
}

at::Tensor bias_act_dropout_fwd(const at::Tensor& x, const at::Tensor& bias, double p, c10::string_view act,
                                int64_t seed, int64_t offset) {
  auto op = bias_act_dropout_fwd_prepare(x, bias, p, act, seed, offset);
  cpu::bias_act_dropout_fwd(op.params);
  return op.y;
}

std::tuple<at::Tensor, at::Tensor> bias_act_dropout_bwd(const at::Tensor& dy, const at::Tensor& x,
                                                        const at::Tensor& bias, double p, c10::string_view act,
                                                        int64_t seed, int64_t offset) {
  auto op = bias_act_dropout_bwd_prepare(dy, x, bias, p, act, seed, offset);
  cpu::bias_act_dropout_bwd(op.params);
  return {op.dx, op.dbias};
}

// Registered for every backend (see cuda_dropout_mask_impl in dropout.h).
at::Tensor dropout_mask(int64_t numel, double p, int64_t seed, int64_t offset, at::Device device) {
  auto op = dropout_mask_prepare(numel, p, seed, offset, device);
  if (device.is_cpu()) {
    cpu::dropout_mask(op.params);
  } else {
    const DropoutMaskImpl cuda_impl = cuda_dropout_mask_impl();
    TORCH_CHECK(cuda_impl != nullptr, "dropout_mask: fairseq_lightseq was built without CUDA, cannot draw on ",
                device);
    cuda_impl(op);
  }
  return op.keep;
}

// ---- attention
std::tuple<at::Tensor, at::Tensor> attention_softmax_fwd(const at::Tensor& scores,
                                                         const c10::optional<at::Tensor>& key_padding_mask,
                                                         bool causal, double scale, double p, int64_t seed,
                                                         int64_t offset, at::IntArrayRef coords) {
  auto op = attention_softmax_fwd_prepare(scores, key_padding_mask, causal, scale, p, seed, offset, coords);
  cpu::attention_softmax_fwd(op.params);
  return {op.y, op.out};
}

at::Tensor attention_softmax_bwd(const at::Tensor& dout, const at::Tensor& y, double scale, double p, int64_t seed,
                                 int64_t offset, at::IntArrayRef coords) {
  auto op = attention_softmax_bwd_prepare(dout, y, scale, p, seed, offset, coords);
  cpu::attention_softmax_bwd(op.params);
  return op.dscores;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> qkv_bias_split(const at::Tensor& qkv, const at::Tensor& bias,
                                                              int64_t num_heads) {
  auto op = qkv_bias_split_prepare(qkv, bias, num_heads);
  cpu::qkv_bias_split(op.params);
  return {op.q, op.k, op.v};
}

std::tuple<at::Tensor, at::Tensor> qkv_bias_split_bwd(const at::Tensor& dq, const at::Tensor& dk,
                                                      const at::Tensor& dv, int64_t num_heads) {
  auto op = qkv_bias_split_bwd_prepare(dq, dk, dv, num_heads);
  cpu::qkv_bias_split_bwd(op.params);
  return {op.dqkv, op.dbias};
}

at::Tensor merge_heads(const at::Tensor& x, int64_t num_heads) {
  auto op = merge_heads_prepare(x, num_heads);
  // A lone head merge is a plain permutation with nothing to fuse: on CPU, ATen's strided copy
  // measured faster than our row loop (0.41 vs 0.51 ms at 4096 x 512, 2 threads), so it does it.
  const auto& q = op.params;
  op.y.view({q.T, q.B, q.H, q.head_dim}).copy_(op.x.view({q.B, q.H, q.T, q.head_dim}).permute({2, 0, 1, 3}));
  return op.y;
}

// ---- embedding (ids range-checked here on the host; the CUDA kernels check them on the device)
at::Tensor embedding_fwd(const at::Tensor& tokens, const at::Tensor& weight, const c10::optional<at::Tensor>& pos_weight,
                         const c10::optional<at::Tensor>& positions, int64_t padding_idx, double scale, double p,
                         int64_t seed, int64_t offset) {
  auto op = embedding_fwd_prepare(tokens, weight, pos_weight, positions, padding_idx, scale, p, seed, offset);
  check_range(op.tokens, op.params.num_embeddings, "token id", "num_embeddings");
  if (op.positions.defined()) check_range(op.positions, op.params.num_positions, "position", "max positions");
  cpu::embedding_fwd(op.params);
  return op.out;
}

std::tuple<at::Tensor, at::Tensor> embedding_bwd(const at::Tensor& grad, const at::Tensor& tokens,
                                                 const c10::optional<at::Tensor>& positions, int64_t num_weights,
                                                 int64_t num_positions, int64_t padding_idx, double scale, double p,
                                                 int64_t seed, int64_t offset) {
  auto op = embedding_bwd_prepare(grad, tokens, positions, num_weights, num_positions, padding_idx, scale, p, seed,
                                  offset);
  // Forward already checked the ranges; they are checked again because a wrong key writes out of bounds.
  if (num_weights > 0) check_range(op.tokens, num_weights, "token id", "num_embeddings");
  if (num_positions > 0) check_range(op.positions, num_positions, "position", "max positions");
  if (num_weights > 0) cpu::embedding_table_grad(op.weight_grad);
  if (num_positions > 0) cpu::embedding_table_grad(op.pos_grad);
  return {op.dweight, op.dpos_weight};
}

// ---- label-smoothed cross entropy
std::tuple<at::Tensor, at::Tensor, at::Tensor> label_smoothed_cross_entropy_fwd(const at::Tensor& logits,
                                                                                const at::Tensor& target,
                                                                                double epsilon, int64_t ignore_index) {
  auto op = ls_cross_entropy_fwd_prepare(logits, target, epsilon, ignore_index);
  cpu::ls_cross_entropy_fwd(op.params);
  return {op.loss, op.nll, op.lse};
}

at::Tensor label_smoothed_cross_entropy_bwd(const at::Tensor& dloss, const at::Tensor& dnll,
                                            const at::Tensor& logits, const at::Tensor& target, const at::Tensor& lse,
                                            double epsilon, int64_t ignore_index) {
  auto op = ls_cross_entropy_bwd_prepare(dloss, dnll, logits, target, lse, epsilon, ignore_index);
  cpu::ls_cross_entropy_bwd(op.params);
  return op.dlogits;
}

// ---- Adam
void adam_step_(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
                int64_t step, double lr, double beta1, double beta2, double eps, double weight_decay,
                double grad_scale) {
  const auto op = adam_step_prepare(params, grads, exp_avgs, exp_avg_sqs, step, lr, beta1, beta2, eps, weight_decay,
                                    grad_scale);
  for (const auto& group : op.groups) {
    cpu::adam_step({.grad_dtype = group.grad_dtype, .tensors = group.table.data(),
                    .num_tensors = static_cast<int64_t>(group.table.size()), .coeffs = op.coeffs});
  }
}

}  // namespace

TORCH_LIBRARY(fairseq_lightseq, m) {
  m.def("layer_norm_fwd(Tensor x, Tensor weight, Tensor bias, float eps) -> (Tensor y, Tensor mean, Tensor rstd)");
  m.def(
      "layer_norm_bwd(Tensor dy, Tensor x, Tensor weight, Tensor mean, Tensor rstd) -> (Tensor dx, Tensor dweight, "
      "Tensor dbias)");

  m.def(
      "bias_dropout_residual_fwd(Tensor x, Tensor bias, Tensor residual, float p, int seed, int offset) -> Tensor");
  m.def("bias_dropout_residual_bwd(Tensor dy, float p, int seed, int offset) -> (Tensor dx, Tensor dbias)");
  m.def("bias_act_dropout_fwd(Tensor x, Tensor bias, float p, str act, int seed, int offset) -> Tensor");
  m.def(
      "bias_act_dropout_bwd(Tensor dy, Tensor x, Tensor bias, float p, str act, int seed, int offset) -> (Tensor dx, "
      "Tensor dbias)");
  m.def("dropout_mask(int numel, float p, int seed, int offset, Device device) -> Tensor");

  m.def(
      "attention_softmax_fwd(Tensor scores, Tensor? key_padding_mask, bool causal, float scale, float p, int seed, "
      "int offset, int[] coords=[]) -> (Tensor y, Tensor out)");
  m.def(
      "attention_softmax_bwd(Tensor dout, Tensor y, float scale, float p, int seed, int offset, int[] coords=[]) -> "
      "Tensor");
  m.def("qkv_bias_split(Tensor qkv, Tensor bias, int num_heads) -> (Tensor q, Tensor k, Tensor v)");
  m.def("qkv_bias_split_bwd(Tensor dq, Tensor dk, Tensor dv, int num_heads) -> (Tensor dqkv, Tensor dbias)");
  m.def("merge_heads(Tensor x, int num_heads) -> Tensor");

  m.def(
      "embedding_fwd(Tensor tokens, Tensor weight, Tensor? pos_weight, Tensor? positions, int padding_idx, "
      "float scale, float p, int seed, int offset) -> Tensor");
  m.def(
      "embedding_bwd(Tensor grad, Tensor tokens, Tensor? positions, int num_weights, int num_positions, "
      "int padding_idx, float scale, float p, int seed, int offset) -> (Tensor dweight, Tensor dpos_weight)");

  m.def(
      "label_smoothed_cross_entropy_fwd(Tensor logits, Tensor target, float epsilon, int ignore_index) -> "
      "(Tensor loss, Tensor nll, Tensor lse)");
  m.def(
      "label_smoothed_cross_entropy_bwd(Tensor dloss, Tensor dnll, Tensor logits, Tensor target, Tensor lse, "
      "float epsilon, int ignore_index) -> Tensor dlogits");

  m.def(
      "adam_step_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, Tensor(c!)[] exp_avg_sqs, int step, "
      "float lr, float beta1, float beta2, float eps, float weight_decay, float grad_scale=1.0) -> ()");
}

TORCH_LIBRARY_IMPL(fairseq_lightseq, CPU, m) {
  FLS_FOR_EACH_DEVICE_OP(FLS_REGISTER_OP)
}

// No tensor argument to dispatch on: one kernel for every backend, branching on `device`.
// CompositeExplicitAutograd (not a catch-all def) so that a fake kernel can be registered for it.
TORCH_LIBRARY_IMPL(fairseq_lightseq, CompositeExplicitAutograd, m) { m.impl("dropout_mask", &dropout_mask); }

}  // namespace fls
