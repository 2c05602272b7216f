// Op wrapper of the fused Adam step: schema, argument checks, the tensor table, CPU/CUDA dispatch.
#include <cmath>
#include <cstring>
#include <vector>

#include "../cpu/adam.h"
#include "../cuda/adam.h"
#include "utils.h"

namespace fls {
namespace {

void check_adam_args(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                     at::TensorList exp_avg_sqs, int64_t step, double lr, double beta1, double beta2, double eps,
                     double weight_decay, double grad_scale) {
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

AdamTensor entry(const at::Tensor& p, const at::Tensor& g, const at::Tensor& m, const at::Tensor& v) {
  return AdamTensor{p.data_ptr<float>(), g.data_ptr(), m.data_ptr<float>(), v.data_ptr<float>(), p.numel()};
}

void adam_step_(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
                int64_t step, double lr, double beta1, double beta2, double eps, double weight_decay,
                double grad_scale) {
  check_adam_args(params, grads, exp_avgs, exp_avg_sqs, step, lr, beta1, beta2, eps, weight_decay, grad_scale);
  if (params.empty()) return;
  const AdamCoeffs c = make_adam_coeffs(step, lr, beta1, beta2, eps, weight_decay, grad_scale);
  // Grads are only read: a non-contiguous one is copied (kept alive in `gc` until the kernels ran).
  std::vector<at::Tensor> gc;
  gc.reserve(grads.size());
  for (const auto& g : grads) gc.push_back(g.contiguous());
  // One launch (CUDA) or one parallel loop (CPU) per grad dtype present.
  for (const auto gtype : {at::kFloat, at::kHalf, at::kBFloat16}) {
    std::vector<AdamTensor> table;
    for (size_t i = 0; i < params.size(); ++i) {
      if (gc[i].scalar_type() == gtype && params[i].numel() > 0) {
        table.push_back(entry(params[i], gc[i], exp_avgs[i], exp_avg_sqs[i]));
      }
    }
    if (table.empty()) continue;
    if (params[0].is_cuda()) {
#ifdef FLS_WITH_CUDA
      const c10::cuda::CUDAGuard guard(params[0].device());
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
      FLS_CHECK_LAUNCH(cuda::adam_step(to_dtype(gtype), reinterpret_cast<const AdamTensor*>(base),
                                       reinterpret_cast<const int64_t*>(base + table_bytes),
                                       static_cast<int64_t>(chunks.size()), c, current_stream(params[0])));
#else
      TORCH_CHECK(false, "adam_step_: fairseq_lightseq was built without CUDA");
#endif
    } else {
      const int64_t nt = static_cast<int64_t>(table.size());
      switch (gtype) {
        case at::kFloat: cpu::adam_step<float>(table.data(), nt, c); break;
        case at::kHalf: cpu::adam_step<c10::Half>(table.data(), nt, c); break;
        default: cpu::adam_step<c10::BFloat16>(table.data(), nt, c); break;
      }
    }
  }
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(fairseq_lightseq, m) {
  m.def(
      "adam_step_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, Tensor(c!)[] exp_avg_sqs, int step, "
      "float lr, float beta1, float beta2, float eps, float weight_decay, float grad_scale=1.0) -> ()");
}

TORCH_LIBRARY_IMPL(fairseq_lightseq, CPU, m) { m.impl("adam_step_", &adam_step_); }

#ifdef FLS_WITH_CUDA
TORCH_LIBRARY_IMPL(fairseq_lightseq, CUDA, m) { m.impl("adam_step_", &adam_step_); }
#endif

}  // namespace fls
