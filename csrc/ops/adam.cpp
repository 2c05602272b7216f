// Op layer of the fused Adam step: the op's schema; the argument checks and the tensor table both devices
// share (adam_step_prepare), then the CPU and the CUDA implementation, each registered under its own
// dispatch key.
#include <cmath>
#include <cstring>
#include <vector>

#include "../kernels/adam.h"
#include "device.h"

namespace fls {
namespace {

inline void check_adam_args(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                            at::TensorList exp_avg_sqs, int64_t step, double lr, double beta1, double beta2,
                            double eps, double weight_decay, double grad_scale) {
  const size_t n = params.size();
  TORCH_CHECK(grads.size() == n, "adam_step_: grads has ", grads.size(), " tensors but params has ", n);
  TORCH_CHECK(exp_avgs.size() == n, "adam_step_: exp_avgs has ", exp_avgs.size(), " tensors but params has ", n);
  TORCH_CHECK(exp_avg_sqs.size() == n, "adam_step_: exp_avg_sqs has ", exp_avg_sqs.size(),
              " tensors but params has ", n);
  TORCH_CHECK(step >= 1, "adam_step_: step must be >= 1 (the step number after this update), got ", step);
  TORCH_CHECK(lr >= 0, "adam_step_: lr must be >= 0, got ", lr);
  TORCH_CHECK(beta1 >= 0 && beta1 < 1, "adam_step_: beta1 must be in [0, 1), got ", beta1);
  TORCH_CHECK(beta2 >= 0 && beta2 < 1, "adam_step_: beta2 must be in [0, 1), got ", beta2);
  TORCH_CHECK(eps >= 0, "adam_step_: eps must be >= 0, got ", eps);
  TORCH_CHECK(weight_decay >= 0, "adam_step_: weight_decay must be >= 0, got ", weight_decay);
  TORCH_CHECK(std::isfinite(grad_scale), "adam_step_: grad_scale must be finite, got ", grad_scale);
  if (n == 0) return;
  const auto device = params[0].device();
  TORCH_CHECK(device.is_cpu() || device.is_cuda(), "adam_step_: params must be on CPU or CUDA, got ", device);
  for (size_t i = 0; i < n; ++i) {
    const at::Tensor &p = params[i], &g = grads[i], &m = exp_avgs[i], &v = exp_avg_sqs[i];
    TORCH_CHECK(p.scalar_type() == at::kFloat, "adam_step_: params[", i, "] must be float32, got ", p.scalar_type());
    TORCH_CHECK(m.scalar_type() == at::kFloat, "adam_step_: exp_avgs[", i, "] must be float32, got ",
                m.scalar_type());
    TORCH_CHECK(v.scalar_type() == at::kFloat, "adam_step_: exp_avg_sqs[", i, "] must be float32, got ",
                v.scalar_type());
    const auto gs = g.scalar_type();
    TORCH_CHECK(gs == at::kFloat || gs == at::kHalf || gs == at::kBFloat16, "adam_step_: grads[", i,
                "] must be float32, float16 or bfloat16, got ", gs);
    for (const at::Tensor* t : {&p, &g, &m, &v}) {
      TORCH_CHECK(t->device() == device, "adam_step_: tensor ", i, " of a list is on ", t->device(),
                  " but params[0] is on ", device, "; all tensors must share one device");
      TORCH_CHECK(t->sizes() == p.sizes(), "adam_step_: grads/exp_avgs/exp_avg_sqs[", i, "] must have shape ",
                  p.sizes(), " like params[", i, "], got ", t->sizes());
    }
    // In-place updates of raw memory: the updated tensors must be dense and not share memory.
    TORCH_CHECK(p.is_contiguous() && m.is_contiguous() && v.is_contiguous(), "adam_step_: params[", i,
                "], exp_avgs[", i, "] and exp_avg_sqs[", i, "] must be contiguous");
    TORCH_CHECK(p.numel() == 0 || (!p.is_same(m) && !p.is_same(v) && !m.is_same(v) &&
                                   p.data_ptr() != m.data_ptr() && p.data_ptr() != v.data_ptr() &&
                                   m.data_ptr() != v.data_ptr()),
                "adam_step_: params[", i, "], exp_avgs[", i, "] and exp_avg_sqs[", i, "] must be distinct tensors");
  }
}

// The host tensor table of the non-empty tensors whose grads have one dtype: one kernel run (one launch on
// CUDA, one parallel loop on CPU) each.
struct AdamGroup {
  DType grad_dtype;
  std::vector<AdamTensor> table;
};

// One adam_step_ call.
struct AdamStep {
  std::vector<at::Tensor> grads;  // contiguous grads, kept alive until the kernels ran
  std::vector<AdamGroup> groups;
  AdamCoeffs coeffs;
};

inline AdamStep adam_step_prepare(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                                  at::TensorList exp_avg_sqs, int64_t step, double lr, double beta1, double beta2,
                                  double eps, double weight_decay, double grad_scale) {
  check_adam_args(params, grads, exp_avgs, exp_avg_sqs, step, lr, beta1, beta2, eps, weight_decay, grad_scale);
  AdamStep op;
  if (params.empty()) return op;
  op.coeffs = make_adam_coeffs(step, lr, beta1, beta2, eps, weight_decay, grad_scale);
  // Grads are only read: a non-contiguous one is copied.
  op.grads.reserve(grads.size());
  for (const auto& g : grads) op.grads.push_back(g.contiguous());
  for (const auto gtype : {at::kFloat, at::kHalf, at::kBFloat16}) {
    AdamGroup group{to_dtype(gtype), {}};
    for (size_t i = 0; i < params.size(); ++i) {
      const at::Tensor& g = op.grads[i];
      if (g.scalar_type() == gtype && params[i].numel() > 0) {
        group.table.push_back(AdamTensor{params[i].data_ptr<float>(), g.data_ptr(), exp_avgs[i].data_ptr<float>(),
                                         exp_avg_sqs[i].data_ptr<float>(), params[i].numel()});
      }
    }
    if (!group.table.empty()) op.groups.push_back(std::move(group));
  }
  return op;
}

// ---- CPU
void adam_step_cpu(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
                   int64_t step, double lr, double beta1, double beta2, double eps, double weight_decay,
                   double grad_scale) {
  const auto op = adam_step_prepare(params, grads, exp_avgs, exp_avg_sqs, step, lr, beta1, beta2, eps, weight_decay,
                                    grad_scale);
  for (const auto& group : op.groups) {
    cpu::adam_step({.grad_dtype = group.grad_dtype, .tensors = group.table.data(),
                    .num_tensors = static_cast<int64_t>(group.table.size()), .coeffs = op.coeffs});
  }
}

// ---- CUDA (registered only in a CUDA build)
void adam_step_cuda(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
                    int64_t step, double lr, double beta1, double beta2, double eps, double weight_decay,
                    double grad_scale) {
  const auto op = adam_step_prepare(params, grads, exp_avgs, exp_avg_sqs, step, lr, beta1, beta2, eps, weight_decay,
                                    grad_scale);
  if (op.groups.empty()) return;
  const c10::DeviceGuard guard(params[0].device());
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
    // host allocator keeps the buffer alive until the copy on this stream has completed. (The emulated
    // device reads it where it is: no pinned allocator, no copy.)
    const int64_t table_bytes = static_cast<int64_t>(table.size() * sizeof(AdamTensor));
    const int64_t bytes = table_bytes + static_cast<int64_t>(chunks.size() * sizeof(int64_t));
    auto host = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(params[0].is_cuda()));
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

TORCH_LIBRARY_FRAGMENT(fairseq_lightseq, m) {
  m.def(
      "adam_step_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, Tensor(c!)[] exp_avg_sqs, int step, "
      "float lr, float beta1, float beta2, float eps, float weight_decay, float grad_scale=1.0) -> ()");
}

TORCH_LIBRARY_IMPL(fairseq_lightseq, CPU, m) {
  m.impl("adam_step_", FLS_CPU_IMPL(adam_step));
}

TORCH_LIBRARY_IMPL(fairseq_lightseq, CUDA, m) {
  if (!kWithCuda) return;
  m.impl("adam_step_", &adam_step_cuda);
}

}  // namespace fls
