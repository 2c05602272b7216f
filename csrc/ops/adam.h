// Op layer of the fused Adam step: argument checks and the tensor table, shared by the CPU and CUDA
// implementations (csrc/ops/cpu_ops.cpp, csrc/ops/cuda/cuda_ops.cpp).
#pragma once
#include <cmath>
#include <vector>

#include "../kernels/adam.h"
#include "utils.h"

namespace fls {

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

}  // namespace fls
