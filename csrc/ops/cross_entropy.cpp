// Op wrapper of the label-smoothed cross-entropy family: schema, argument checks, allocation,
// CPU/CUDA dispatch. Forward saves only the per-row logsumexp (never a [N, V] log-prob tensor).
#include "../cpu/cross_entropy.h"
#include "../cuda/cross_entropy.h"
#include "utils.h"

namespace fls {
namespace {

at::ScalarType stat_type(const at::Tensor& logits) {
  return logits.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// Common checks; returns V. Every target must be ignore_index or in [0, V): the first one that is
// not is named in the error (on CUDA this costs one device sync).
int64_t check_inputs(const char* op, const at::Tensor& logits, const at::Tensor& target, double epsilon,
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
  if (N == 0) return V;
  const auto bad = target.ne(ignore_index).logical_and(target.lt(0).logical_or(target.ge(V)));
  if (bad.any().item<bool>()) {
    const int64_t i = bad.nonzero()[0][0].item<int64_t>();
    TORCH_CHECK(false, op, ": target[", i, "] = ", target[i].item<int64_t>(), " is out of range for V = ", V,
                " classes (must be in [0, ", V, ") or equal ignore_index = ", ignore_index, ")");
  }
  return V;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> ls_cross_entropy_fwd(const at::Tensor& logits,
                                                                    const at::Tensor& target, double epsilon,
                                                                    int64_t ignore_index) {
  const char* op = "label_smoothed_cross_entropy";
  const int64_t V = check_inputs(op, logits, target, epsilon, ignore_index);
  const int64_t N = logits.size(0);
  const auto zc = logits.contiguous();
  const auto tc = target.contiguous();
  const auto opts = logits.options().dtype(stat_type(logits));
  auto loss = at::empty({N}, opts);
  auto nll = at::empty({N}, opts);
  auto lse = at::empty({N}, opts);
  if (N == 0) return {loss, nll, lse};
  if (logits.is_cuda()) {
#ifdef FLS_WITH_CUDA
    const c10::cuda::CUDAGuard guard(logits.device());
    TORCH_CHECK(N <= 2147483647LL, op, ": at most 2^31-1 rows on CUDA, got ", N);
    FLS_CHECK_LAUNCH(cuda::ls_cross_entropy_fwd(to_dtype(logits.scalar_type()), zc.data_ptr(),
                                                tc.data_ptr<int64_t>(), loss.data_ptr<float>(),
                                                nll.data_ptr<float>(), lse.data_ptr<float>(), N, V, epsilon,
                                                ignore_index, current_stream(logits)));
#endif
  } else {
    AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, logits.scalar_type(), "ls_cross_entropy_fwd", [&] {
      using A = cpu::acc_t<scalar_t>;
      cpu::ls_cross_entropy_fwd<scalar_t>(zc.data_ptr<scalar_t>(), tc.data_ptr<int64_t>(), loss.data_ptr<A>(),
                                          nll.data_ptr<A>(), lse.data_ptr<A>(), N, V, epsilon, ignore_index);
    });
  }
  return {loss, nll, lse};
}

at::Tensor ls_cross_entropy_bwd(const at::Tensor& dloss, const at::Tensor& dnll, const at::Tensor& logits,
                                const at::Tensor& target, const at::Tensor& lse, double epsilon,
                                int64_t ignore_index) {
  const char* op = "label_smoothed_cross_entropy_bwd";
  // Targets were checked by the forward that produced lse.
  check_float(logits, "label_smoothed_cross_entropy_bwd: logits");
  TORCH_CHECK(logits.dim() == 2 && logits.size(1) > 0, op, ": logits must be 2-D [N, V] with V >= 1, got shape ",
              logits.sizes());
  const int64_t N = logits.size(0), V = logits.size(1);
  TORCH_CHECK(target.scalar_type() == at::kLong, op, ": target must be int64, got ", target.scalar_type());
  check_shape(target, {N}, "label_smoothed_cross_entropy_bwd: target");
  check_shape(dloss, {N}, "label_smoothed_cross_entropy_bwd: dloss");
  check_shape(dnll, {N}, "label_smoothed_cross_entropy_bwd: dnll");
  check_shape(lse, {N}, "label_smoothed_cross_entropy_bwd: lse");
  for (const auto* t : {&target, &dloss, &dnll, &lse}) {
    TORCH_CHECK(t->device() == logits.device(), op, ": all inputs must be on ", logits.device(), ", got one on ",
                t->device());
  }
  TORCH_CHECK(lse.scalar_type() == stat_type(logits), op, ": lse must be ", stat_type(logits), ", got ",
              lse.scalar_type());
  TORCH_CHECK(epsilon >= 0.0 && epsilon <= 1.0, op, ": epsilon must be in [0, 1], got ", epsilon);
  const auto st = stat_type(logits);
  const auto dl = dloss.to(st).contiguous(), dn = dnll.to(st).contiguous();
  const auto zc = logits.contiguous(), tc = target.contiguous(), lc = lse.contiguous();
  auto dz = at::empty_like(zc);
  if (N == 0) return dz;
  if (logits.is_cuda()) {
#ifdef FLS_WITH_CUDA
    const c10::cuda::CUDAGuard guard(logits.device());
    TORCH_CHECK(N <= 2147483647LL, op, ": at most 2^31-1 rows on CUDA, got ", N);
    FLS_CHECK_LAUNCH(cuda::ls_cross_entropy_bwd(to_dtype(logits.scalar_type()), dl.data_ptr<float>(),
                                                dn.data_ptr<float>(), zc.data_ptr(), tc.data_ptr<int64_t>(),
                                                lc.data_ptr<float>(), dz.data_ptr(), N, V, epsilon, ignore_index,
                                                current_stream(logits)));
#endif
  } else {
    AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, logits.scalar_type(), "ls_cross_entropy_bwd", [&] {
      using A = cpu::acc_t<scalar_t>;
      cpu::ls_cross_entropy_bwd<scalar_t>(dl.data_ptr<A>(), dn.data_ptr<A>(), zc.data_ptr<scalar_t>(),
                                          tc.data_ptr<int64_t>(), lc.data_ptr<A>(), dz.data_ptr<scalar_t>(), N, V,
                                          epsilon, ignore_index);
    });
  }
  return dz;
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
  m.impl("label_smoothed_cross_entropy_fwd", &ls_cross_entropy_fwd);
  m.impl("label_smoothed_cross_entropy_bwd", &ls_cross_entropy_bwd);
}

#ifdef FLS_WITH_CUDA
TORCH_LIBRARY_IMPL(fairseq_lightseq, CUDA, m) {
  m.impl("label_smoothed_cross_entropy_fwd", &ls_cross_entropy_fwd);
  m.impl("label_smoothed_cross_entropy_bwd", &ls_cross_entropy_bwd);
}
#endif

}  // namespace fls
