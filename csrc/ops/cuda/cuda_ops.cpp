// The CUDA implementation of every op, registered under the CUDA dispatch key. Compiled only in a CUDA
// build (setup.py adds csrc/ops/cuda/*.cpp then), by the host compiler with torch's headers; the kernels
// it launches are plain CUDA (csrc/cuda/*.cu) reached through the raw-pointer launchers of
// csrc/kernels/<family>.h. Each implementation: device guard, the family's check-and-allocate function
// (csrc/ops/<family>.h), CUDA-only limits and scratch memory, the launch on the current stream.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <cstring>
#include <vector>

#include "../adam.h"
#include "../attention.h"
#include "../cross_entropy.h"
#include "../dropout.h"
#include "../embedding.h"
#include "../layer_norm.h"
#include "../op_list.h"

namespace fls {
namespace {

void* stream_of(const at::Tensor& t) {
  return static_cast<void*>(at::cuda::getCurrentCUDAStream(t.device().index()).stream());
}

// Launchers return an int cudaError_t (0 = success) so that their headers stay free of CUDA.
#define FLS_CHECK_LAUNCH(expr)                                                                      \
  do {                                                                                              \
    const int fls_err_ = (expr);                                                                    \
    TORCH_CHECK(fls_err_ == 0, "fairseq_lightseq CUDA kernel failed: ", #expr, " returned cudaError ", \
                fls_err_, " (", cudaGetErrorString(static_cast<cudaError_t>(fls_err_)), ")");     \
  } while (0)

// Scratch floats for the deterministic column sums of a backward.
at::Tensor workspace(int64_t floats, const at::Tensor& like) {
  return at::empty({floats}, like.options().dtype(at::kFloat));
}

constexpr int64_t kMaxRows32 = 2147483647LL;  // row counts that index a 32-bit grid dimension

// ---- layer norm
std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_fwd(const at::Tensor& x, const at::Tensor& weight,
                                                              const at::Tensor& bias, double eps) {
  const c10::cuda::CUDAGuard guard(x.device());
  auto op = layer_norm_fwd_prepare(x, weight, bias, eps);
  TORCH_CHECK(op.params.rows <= kMaxRows32, "layer_norm: at most 2^31-1 rows on CUDA, got ", op.params.rows);
  FLS_CHECK_LAUNCH(cuda::layer_norm_fwd(op.params, stream_of(x)));
  return {op.y, op.mean, op.rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_bwd(const at::Tensor& dy, const at::Tensor& x,
                                                              const at::Tensor& weight, const at::Tensor& mean,
                                                              const at::Tensor& rstd) {
  const c10::cuda::CUDAGuard guard(x.device());
  auto op = layer_norm_bwd_prepare(dy, x, weight, mean, rstd);
  const int64_t rows = op.params.rows;
  TORCH_CHECK(rows <= 64LL * 65535, "layer_norm_bwd: at most ", 64LL * 65535, " rows on CUDA, got ", rows);
  auto ws = workspace(cuda::layer_norm_bwd_workspace(rows, op.params.cols), x);
  FLS_CHECK_LAUNCH(cuda::layer_norm_bwd(op.params, ws.data_ptr<float>(), stream_of(x)));
  return {op.dx, op.dweight, op.dbias};
}

// ---- dropout
at::Tensor bias_dropout_residual_fwd(const at::Tensor& x, const at::Tensor& bias, const at::Tensor& residual,
                                     double p, int64_t seed, int64_t offset) {
  const c10::cuda::CUDAGuard guard(x.device());
  auto op = bias_dropout_residual_fwd_prepare(x, bias, residual, p, seed, offset);
  FLS_CHECK_LAUNCH(cuda::bias_act_dropout_fwd(op.params, stream_of(x)));
  return op.y;
}

std::tuple<at::Tensor, at::Tensor> bias_act_bwd(const BiasActDropoutBwd& op) {
  auto ws = workspace(cuda::bias_act_dropout_bwd_workspace(op.params.rows, op.params.cols), op.dy);
  FLS_CHECK_LAUNCH(cuda::bias_act_dropout_bwd(op.params, ws.data_ptr<float>(), stream_of(op.dy)));
  return {op.dx, op.dbias};
}

std::tuple<at::Tensor, at::Tensor> bias_dropout_residual_bwd(const at::Tensor& dy, double p, int64_t seed,
                                                             int64_t offset) {
  const c10::cuda::CUDAGuard guard(dy.device());
  return bias_act_bwd(bias_dropout_residual_bwd_prepare(dy, p, seed, offset));
}

at::Tensor bias_act_dropout_fwd(const at::Tensor& x, const at::Tensor& bias, double p, c10::string_view act,
                                int64_t seed, int64_t offset) {
  const c10::cuda::CUDAGuard guard(x.device());
  auto op = bias_act_dropout_fwd_prepare(x, bias, p, act, seed, offset);
  FLS_CHECK_LAUNCH(cuda::bias_act_dropout_fwd(op.params, stream_of(x)));
  return op.y;
}

std::tuple<at::Tensor, at::Tensor> bias_act_dropout_bwd(const at::Tensor& dy, const at::Tensor& x,
                                                        const at::Tensor& bias, double p, c10::string_view act,
                                                        int64_t seed, int64_t offset) {
  const c10::cuda::CUDAGuard guard(dy.device());
  return bias_act_bwd(bias_act_dropout_bwd_prepare(dy, x, bias, p, act, seed, offset));
}

// Reached through cuda_dropout_mask_impl (dropout.h) from the one dropout_mask kernel of every backend.
void dropout_mask(const DropoutMask& op) {
  const c10::cuda::CUDAGuard guard(op.keep.device());
  FLS_CHECK_LAUNCH(cuda::dropout_mask(op.params, stream_of(op.keep)));
}

// ---- attention
std::tuple<at::Tensor, at::Tensor> attention_softmax_fwd(const at::Tensor& scores,
                                                         const c10::optional<at::Tensor>& key_padding_mask,
                                                         bool causal, double scale, double p, int64_t seed,
                                                         int64_t offset, at::IntArrayRef coords) {
  const c10::cuda::CUDAGuard guard(scores.device());
  auto op = attention_softmax_fwd_prepare(scores, key_padding_mask, causal, scale, p, seed, offset, coords);
  const int64_t rows = op.params.B * op.params.H * op.params.Tq;
  TORCH_CHECK(rows <= kMaxRows32, "attention_softmax: at most 2^31-1 rows (B*H*Tq) on CUDA, got ", rows);
  FLS_CHECK_LAUNCH(cuda::attention_softmax_fwd(op.params, stream_of(scores)));
  return {op.y, op.out};
}

at::Tensor attention_softmax_bwd(const at::Tensor& dout, const at::Tensor& y, double scale, double p, int64_t seed,
                                 int64_t offset, at::IntArrayRef coords) {
  const c10::cuda::CUDAGuard guard(y.device());
  auto op = attention_softmax_bwd_prepare(dout, y, scale, p, seed, offset, coords);
  TORCH_CHECK(op.params.rows <= kMaxRows32, "attention_softmax_bwd: at most 2^31-1 rows (B*H*Tq) on CUDA, got ",
              op.params.rows);
  FLS_CHECK_LAUNCH(cuda::attention_softmax_bwd(op.params, stream_of(y)));
  return op.dscores;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> qkv_bias_split(const at::Tensor& qkv, const at::Tensor& bias,
                                                              int64_t num_heads) {
  const c10::cuda::CUDAGuard guard(qkv.device());
  auto op = qkv_bias_split_prepare(qkv, bias, num_heads);
  FLS_CHECK_LAUNCH(cuda::qkv_bias_split(op.params, stream_of(qkv)));
  return {op.q, op.k, op.v};
}

std::tuple<at::Tensor, at::Tensor> qkv_bias_split_bwd(const at::Tensor& dq, const at::Tensor& dk,
                                                      const at::Tensor& dv, int64_t num_heads) {
  const c10::cuda::CUDAGuard guard(dq.device());
  auto op = qkv_bias_split_bwd_prepare(dq, dk, dv, num_heads);
  const auto& q = op.params;
  auto ws = workspace(cuda::qkv_bias_split_bwd_workspace(q.T * q.B, 3 * q.H * q.head_dim), dq);
  FLS_CHECK_LAUNCH(cuda::qkv_bias_split_bwd(op.params, ws.data_ptr<float>(), stream_of(dq)));
  return {op.dqkv, op.dbias};
}

at::Tensor merge_heads(const at::Tensor& x, int64_t num_heads) {
  const c10::cuda::CUDAGuard guard(x.device());
  auto op = merge_heads_prepare(x, num_heads);
  FLS_CHECK_LAUNCH(cuda::merge_heads(op.params, stream_of(x)));
  return op.y;
}

// ---- embedding (ids range-checked inside the kernels: a host check would sync the stream)
at::Tensor embedding_fwd(const at::Tensor& tokens, const at::Tensor& weight, const c10::optional<at::Tensor>& pos_weight,
                         const c10::optional<at::Tensor>& positions, int64_t padding_idx, double scale, double p,
                         int64_t seed, int64_t offset) {
  const c10::cuda::CUDAGuard guard(weight.device());
  auto op = embedding_fwd_prepare(tokens, weight, pos_weight, positions, padding_idx, scale, p, seed, offset);
  FLS_CHECK_LAUNCH(cuda::embedding_fwd(op.params, stream_of(weight)));
  return op.out;
}

// Deterministic gradient of one table: pad rows get the key kNoGradKey (skipped), a stable sort on the
// device groups equal keys in row order (no host sync); the kernel sums each run in that order.
void table_grad(const EmbeddingTableGradParams& p, const at::Tensor& keys, const at::Tensor& pad_rows,
                const at::Tensor& out) {
  const auto k = keys.reshape({-1}).masked_fill(pad_rows, cuda::kNoGradKey);
  const auto sorted = at::sort(k, /*stable=*/true, /*dim=*/0, /*descending=*/false);
  FLS_CHECK_LAUNCH(cuda::embedding_table_grad(p, std::get<0>(sorted).data_ptr<int64_t>(),
                                              std::get<1>(sorted).data_ptr<int64_t>(), stream_of(out)));
}

std::tuple<at::Tensor, at::Tensor> embedding_bwd(const at::Tensor& grad, const at::Tensor& tokens,
                                                 const c10::optional<at::Tensor>& positions, int64_t num_weights,
                                                 int64_t num_positions, int64_t padding_idx, double scale, double p,
                                                 int64_t seed, int64_t offset) {
  const c10::cuda::CUDAGuard guard(grad.device());
  auto op = embedding_bwd_prepare(grad, tokens, positions, num_weights, num_positions, padding_idx, scale, p, seed,
                                  offset);
  // The kernel writes only the rows it sums.
  op.dweight.zero_();
  op.dpos_weight.zero_();
  if (op.weight_grad.n > 0 && op.weight_grad.dim > 0 && (num_weights > 0 || num_positions > 0)) {
    const auto pad_rows = op.tokens.reshape({-1}).eq(padding_idx);
    if (num_weights > 0) table_grad(op.weight_grad, op.tokens, pad_rows, op.dweight);
    if (num_positions > 0) table_grad(op.pos_grad, op.positions, pad_rows, op.dpos_weight);
  }
  return {op.dweight, op.dpos_weight};
}

// ---- label-smoothed cross entropy
std::tuple<at::Tensor, at::Tensor, at::Tensor> label_smoothed_cross_entropy_fwd(const at::Tensor& logits,
                                                                                const at::Tensor& target,
                                                                                double epsilon, int64_t ignore_index) {
  const c10::cuda::CUDAGuard guard(logits.device());
  auto op = ls_cross_entropy_fwd_prepare(logits, target, epsilon, ignore_index);
  TORCH_CHECK(op.params.rows <= kMaxRows32, "label_smoothed_cross_entropy: at most 2^31-1 rows on CUDA, got ",
              op.params.rows);
  FLS_CHECK_LAUNCH(cuda::ls_cross_entropy_fwd(op.params, stream_of(logits)));
  return {op.loss, op.nll, op.lse};
}

at::Tensor label_smoothed_cross_entropy_bwd(const at::Tensor& dloss, const at::Tensor& dnll,
                                            const at::Tensor& logits, const at::Tensor& target, const at::Tensor& lse,
                                            double epsilon, int64_t ignore_index) {
  const c10::cuda::CUDAGuard guard(logits.device());
  auto op = ls_cross_entropy_bwd_prepare(dloss, dnll, logits, target, lse, epsilon, ignore_index);
  TORCH_CHECK(op.params.rows <= kMaxRows32, "label_smoothed_cross_entropy_bwd: at most 2^31-1 rows on CUDA, got ",
              op.params.rows);
  FLS_CHECK_LAUNCH(cuda::ls_cross_entropy_bwd(op.params, stream_of(logits)));
  return op.dlogits;
}

// ---- Adam
void adam_step_(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
                int64_t step, double lr, double beta1, double beta2, double eps, double weight_decay,
                double grad_scale) {
  const auto op = adam_step_prepare(params, grads, exp_avgs, exp_avg_sqs, step, lr, beta1, beta2, eps, weight_decay,
                                    grad_scale);
  if (op.groups.empty()) return;
  const c10::cuda::CUDAGuard guard(params[0].device());
  for (const auto& group : op.groups) {
    const auto& table = group.table;
    std::vector<int64_t> chunks;
    for (size_t t = 0; t < table.size(); ++t) {
      const int64_t nc = (table[t].n + cuda::kAdamChunk - 1) / cuda::kAdamChunk;
      TORCH_CHECK(nc < (int64_t(1) << 32), "adam_step_: a tensor of ", table[t].n,
                  " elements exceeds the supported maximum of 2^32 chunks of ", cuda::kAdamChunk);
      for (int64_t k = 0; k < nc; ++k) chunks.push_back(cuda::adam_chunk_entry(static_cast<int64_t>(t), k));
    }
    // Table and chunk list in one pinned buffer, copied without blocking the host; the caching
    // host allocator keeps the buffer alive until the copy on this stream has completed.
    const int64_t table_bytes = static_cast<int64_t>(table.size() * sizeof(AdamTensor));
    const int64_t bytes = table_bytes + static_cast<int64_t>(chunks.size() * sizeof(int64_t));
    auto host = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
    std::memcpy(host.data_ptr(), table.data(), table_bytes);
    std::memcpy(static_cast<char*>(host.data_ptr()) + table_bytes, chunks.data(), bytes - table_bytes);
    auto dev = host.to(params[0].device(), at::kByte, /*non_blocking=*/true);
    const auto* base = static_cast<const char*>(dev.data_ptr());
    const AdamStepParams p = {.grad_dtype = group.grad_dtype,
                              .tensors = reinterpret_cast<const AdamTensor*>(base),
                              .num_tensors = static_cast<int64_t>(table.size()),
                              .coeffs = op.coeffs};
    FLS_CHECK_LAUNCH(cuda::adam_step(p, reinterpret_cast<const int64_t*>(base + table_bytes),
                                     static_cast<int64_t>(chunks.size()), stream_of(params[0])));
  }
}

}  // namespace

TORCH_LIBRARY_IMPL(fairseq_lightseq, CUDA, m) {
  FLS_FOR_EACH_DEVICE_OP(FLS_REGISTER_OP)
  // dropout_mask has no tensor argument to dispatch on; see cuda_dropout_mask_impl in ../dropout.h.
  cuda_dropout_mask_impl() = &dropout_mask;
}

}  // namespace fls
