// Op layer of the label-smoothed cross-entropy family: the ops' schemas; per op, the argument checks and
// output allocation both devices share (<op>_prepare), then the CPU and the CUDA implementation, each
// registered under its own dispatch key. Forward saves only the per-row logsumexp (never a [N, V] log-prob
// tensor).
#include <string>

#include "../kernels/cross_entropy.h"
#include "device.h"

namespace fls {
namespace {

// Common checks; returns V. Every target must be ignore_index or in [0, V): the first one that is not is
// named in the error: here on the CPU, by the forward kernel's device assert on CUDA.
inline int64_t check_xent_inputs(const char* op, const at::Tensor& logits, const at::Tensor& target, double epsilon,
                                 int64_t ignore_index) {
  check_float(logits, (std::string(op) + ": logits").c_str());
  TORCH_CHECK(logits.dim() == 2, op, ": logits must be 2-D [N, V], got shape ", logits.sizes());
  const int64_t N = logits.size(0), V = logits.size(1);
  TORCH_CHECK(V > 0, op, ": logits must have V >= 1 classes, got shape ", logits.sizes());
  TORCH_CHECK(target.scalar_type() == at::kLong, op, ": target must be int64, got ", target.scalar_type());
  TORCH_CHECK(target.device() == logits.device(), op, ": target is on ", target.device(), " but logits is on ",
              logits.device());
  check_shape(target, {N}, (std::string(op) + ": target").c_str());
  TORCH_CHECK(epsilon >= 0.0 && epsilon <= 1.0, op, ": epsilon must be in [0, 1], got ", epsilon);
  // On CUDA the forward kernel checks the targets itself (a host check would sync the device per call).
  if (N == 0 || runs_cuda(logits)) return V;
  const auto bad = target.ne(ignore_index).logical_and(target.lt(0).logical_or(target.ge(V)));
  if (bad.any().item<bool>()) {
    const int64_t i = bad.nonzero()[0][0].item<int64_t>();
    TORCH_CHECK(false, op, ": target[", i, "] = ", target[i].item<int64_t>(), " is out of range for V = ", V,
                " classes (must be in [0, ", V, ") or equal ignore_index = ", ignore_index, ")");
  }
  return V;
}

struct LsCrossEntropyFwd {
  at::Tensor logits, target;
  at::Tensor loss, nll, lse;
  LsCrossEntropyFwdParams params;
};

inline LsCrossEntropyFwd ls_cross_entropy_fwd_prepare(const at::Tensor& logits, const at::Tensor& target,
                                                      double epsilon, int64_t ignore_index) {
  const int64_t V = check_xent_inputs("label_smoothed_cross_entropy", logits, target, epsilon, ignore_index);
  const int64_t N = logits.size(0);
  LsCrossEntropyFwd op;
  op.logits = logits.contiguous();
  op.target = target.contiguous();
  const auto opts = logits.options().dtype(acc_type(logits));
  op.loss = at::empty({N}, opts);
  op.nll = at::empty({N}, opts);
  op.lse = at::empty({N}, opts);
  op.params = {.dtype = to_dtype(logits.scalar_type()), .logits = op.logits.data_ptr(),
               .target = op.target.data_ptr<int64_t>(), .loss = op.loss.data_ptr(), .nll = op.nll.data_ptr(),
               .lse = op.lse.data_ptr(), .rows = N, .V = V, .epsilon = epsilon, .ignore_index = ignore_index};
  return op;
}

struct LsCrossEntropyBwd {
  at::Tensor dloss, dnll, logits, target, lse;
  at::Tensor dlogits;
  LsCrossEntropyBwdParams params;
};

inline LsCrossEntropyBwd ls_cross_entropy_bwd_prepare(const at::Tensor& dloss, const at::Tensor& dnll,
                                                      const at::Tensor& logits, const at::Tensor& target,
                                                      const at::Tensor& lse, double epsilon, int64_t ignore_index) {
  const char* op_name = "label_smoothed_cross_entropy_bwd";
  // Targets were checked by the forward that produced lse.
  check_float(logits, "label_smoothed_cross_entropy_bwd: logits");
  TORCH_CHECK(logits.dim() == 2 && logits.size(1) > 0, op_name,
              ": logits must be 2-D [N, V] with V >= 1, got shape ", logits.sizes());
  const int64_t N = logits.size(0), V = logits.size(1);
  TORCH_CHECK(target.scalar_type() == at::kLong, op_name, ": target must be int64, got ", target.scalar_type());
  check_shape(target, {N}, "label_smoothed_cross_entropy_bwd: target");
  check_shape(dloss, {N}, "label_smoothed_cross_entropy_bwd: dloss");
  check_shape(dnll, {N}, "label_smoothed_cross_entropy_bwd: dnll");
  check_shape(lse, {N}, "label_smoothed_cross_entropy_bwd: lse");
  for (const auto* t : {&target, &dloss, &dnll, &lse}) {
    TORCH_CHECK(t->device() == logits.device(), op_name, ": all inputs must be on ", logits.device(),
                ", got one on ", t->device());
  }
  const auto st = acc_type(logits);
  TORCH_CHECK(lse.scalar_type() == st, op_name, ": lse must be ", st, ", got ", lse.scalar_type());
  TORCH_CHECK(epsilon >= 0.0 && epsilon <= 1.0, op_name, ": epsilon must be in [0, 1], got ", epsilon);
  LsCrossEntropyBwd op;
  op.dloss = dloss.to(st).contiguous();
  op.dnll = dnll.to(st).contiguous();
  op.logits = logits.contiguous();
  op.target = target.contiguous();
  op.lse = lse.contiguous();
  op.dlogits = at::empty_like(op.logits);
  op.params = {.dtype = to_dtype(logits.scalar_type()), .dloss = op.dloss.data_ptr(), .dnll = op.dnll.data_ptr(),
               .logits = op.logits.data_ptr(), .target = op.target.data_ptr<int64_t>(), .lse = op.lse.data_ptr(),
               .dlogits = op.dlogits.data_ptr(), .rows = N, .V = V, .epsilon = epsilon,
               .ignore_index = ignore_index};
  return op;
}

// ---- CPU
std::tuple<at::Tensor, at::Tensor, at::Tensor> label_smoothed_cross_entropy_fwd_cpu(const at::Tensor& logits,
                                                                                    const at::Tensor& target,
                                                                                    double epsilon,
                                                                                    int64_t ignore_index) {
  auto op = ls_cross_entropy_fwd_prepare(logits, target, epsilon, ignore_index);
  cpu::ls_cross_entropy_fwd(op.params);
  return {op.loss, op.nll, op.lse};
}

at::Tensor label_smoothed_cross_entropy_bwd_cpu(const at::Tensor& dloss, const at::Tensor& dnll,
                                                const at::Tensor& logits, const at::Tensor& target,
                                                const at::Tensor& lse, double epsilon, int64_t ignore_index) {
  auto op = ls_cross_entropy_bwd_prepare(dloss, dnll, logits, target, lse, epsilon, ignore_index);
  cpu::ls_cross_entropy_bwd(op.params);
  return op.dlogits;
}

// ---- CUDA (registered only in a CUDA build)
std::tuple<at::Tensor, at::Tensor, at::Tensor> label_smoothed_cross_entropy_fwd_cuda(const at::Tensor& logits,
                                                                                     const at::Tensor& target,
                                                                                     double epsilon,
                                                                                     int64_t ignore_index) {
  const c10::DeviceGuard guard(logits.device());
  auto op = ls_cross_entropy_fwd_prepare(logits, target, epsilon, ignore_index);
  TORCH_CHECK(op.params.rows <= kMaxRows32, "label_smoothed_cross_entropy: at most 2^31-1 rows on CUDA, got ",
              op.params.rows);
  FLS_CHECK_LAUNCH(cuda::ls_cross_entropy_fwd(op.params, stream_of(logits)));
  return {op.loss, op.nll, op.lse};
}

at::Tensor label_smoothed_cross_entropy_bwd_cuda(const at::Tensor& dloss, const at::Tensor& dnll,
                                                 const at::Tensor& logits, const at::Tensor& target,
                                                 const at::Tensor& lse, double epsilon, int64_t ignore_index) {
  const c10::DeviceGuard guard(logits.device());
  auto op = ls_cross_entropy_bwd_prepare(dloss, dnll, logits, target, lse, epsilon, ignore_index);
  TORCH_CHECK(op.params.rows <= kMaxRows32, "label_smoothed_cross_entropy_bwd: at most 2^31-1 rows on CUDA, got ",
              op.params.rows);
  FLS_CHECK_LAUNCH(cuda::ls_cross_entropy_bwd(op.params, stream_of(logits)));
  return op.dlogits;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(fairseq_lightseq, m) {
  m.def(
      "label_smoothed_cross_entropy_fwd(Tensor logits, Tensor target, float epsilon, int ignore_index) -> "
      "(Tensor loss, Tensor nll, Tensor lse)");
  m.def(
      "label_smoothed_cross_entropy_bwd(Tensor dloss, Tensor dnll, Tensor logits, Tensor target, Tensor lse, "
      "float epsilon, int ignore_index) -> Tensor dlogits");
}

TORCH_LIBRARY_IMPL(fairseq_lightseq, CPU, m) {
  m.impl("label_smoothed_cross_entropy_fwd", FLS_CPU_IMPL(label_smoothed_cross_entropy_fwd));
  m.impl("label_smoothed_cross_entropy_bwd", FLS_CPU_IMPL(label_smoothed_cross_entropy_bwd));
}

TORCH_LIBRARY_IMPL(fairseq_lightseq, CUDA, m) {
  if (!kWithCuda) return;
  m.impl("label_smoothed_cross_entropy_fwd", &label_smoothed_cross_entropy_fwd_cuda);
  m.impl("label_smoothed_cross_entropy_bwd", &label_smoothed_cross_entropy_bwd_cuda);
}

}  // namespace fls
