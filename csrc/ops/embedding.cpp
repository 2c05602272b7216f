// Op wrapper of the embedding family: schema, argument checks (dtypes, shapes, token/position ranges),
// allocation, CPU/CUDA dispatch. Ranges are checked here on CPU and inside the kernels on CUDA (a host-side
// check there would copy a device min/max to the host: one stream sync per call). The CUDA backward sorts
// the lookup keys here (stable at::sort, on the device, no sync) and hands the sorted keys and row order to
// the raw kernel, which sums each run of equal keys in row order (deterministic).
#include <c10/util/Optional.h>

#include <cstdint>

#include "../cpu/embedding.h"
#include "../cuda/embedding.h"
#include "utils.h"

namespace fls {
namespace {

void check_index(const at::Tensor& t, const at::Tensor& tokens, const char* name) {
  TORCH_CHECK(t.scalar_type() == at::kLong, "embedding: ", name, " must be int64, got ", t.scalar_type());
  TORCH_CHECK(t.device() == tokens.device(), "embedding: ", name, " is on ", t.device(), " but tokens is on ",
              tokens.device());
}

// (min, max) of a CPU int64 tensor.
std::pair<int64_t, int64_t> min_max(const at::Tensor& t) {
  if (t.numel() == 0) return {0, 0};
  TORCH_INTERNAL_ASSERT(t.device().is_cpu(), "embedding: min_max is the CPU range check");
  const auto c = t.contiguous();
  const int64_t* p = c.data_ptr<int64_t>();
  int64_t lo = p[0], hi = p[0];
  for (int64_t i = 1, n = c.numel(); i < n; ++i) {
    lo = std::min(lo, p[i]);
    hi = std::max(hi, p[i]);
  }
  return {lo, hi};
}

// CPU only: on CUDA the kernels check every id (printf of the id and the limit, then a device assert).
void check_range(const at::Tensor& t, int64_t limit, const char* what, const char* limit_name) {
  if (t.is_cuda()) return;
  const auto mm = min_max(t);
  TORCH_CHECK(mm.first >= 0, "embedding: ", what, " ", mm.first, " is negative");
  TORCH_CHECK(mm.second < limit, "embedding: ", what, " ", mm.second, " exceeds ", limit_name, " ", limit,
              " (valid: 0..", limit - 1, ")");
}

// out [B, T, E] = dropout(scale * weight[tokens] + pos_weight[positions]); zeros at pad tokens.
at::Tensor embedding_fwd(const at::Tensor& tokens, const at::Tensor& weight, const c10::optional<at::Tensor>& pos_weight,
                         const c10::optional<at::Tensor>& positions, int64_t padding_idx, double scale, double p,
                         int64_t seed, int64_t offset) {
  check_float(weight, "embedding: weight");
  TORCH_CHECK(weight.dim() == 2, "embedding: weight must be [num_embeddings, dim], got shape ", weight.sizes());
  check_index(tokens, weight, "tokens");
  const int64_t dim = weight.size(1);
  const bool has_pos = pos_weight.has_value() && pos_weight->defined();
  at::Tensor pw, pos;
  if (has_pos) {
    pw = pos_weight->contiguous();
    check_same(pw, weight, "embedding: pos_weight", "weight");
    TORCH_CHECK(pw.dim() == 2 && pw.size(1) == dim, "embedding: pos_weight must be [max_positions, ", dim,
                "], got shape ", pw.sizes());
    TORCH_CHECK(positions.has_value() && positions->defined(), "embedding: positions are required with pos_weight");
    pos = positions->contiguous();
    check_index(pos, tokens, "positions");
    check_shape(pos, tokens.sizes(), "embedding: positions");
  }
  const auto d = make_dropout(p, seed, offset);
  const auto tok = tokens.contiguous();
  const auto w = weight.contiguous();
  check_range(tok, w.size(0), "token id", "num_embeddings");
  if (has_pos) check_range(pos, pw.size(0), "position", "max positions");
  const int64_t n = tok.numel();
  auto out_sizes = tok.sizes().vec();
  out_sizes.push_back(dim);
  auto out = at::empty(out_sizes, w.options());
  const int64_t* pos_ptr = has_pos ? pos.data_ptr<int64_t>() : nullptr;
  if (w.is_cuda()) {
#ifdef FLS_WITH_CUDA
    const c10::cuda::CUDAGuard guard(w.device());
    FLS_CHECK_LAUNCH(cuda::embedding_fwd(to_dtype(w.scalar_type()), tok.data_ptr<int64_t>(), pos_ptr, w.data_ptr(),
                                         has_pos ? pw.data_ptr() : nullptr, out.data_ptr(), n, dim, w.size(0),
                                         has_pos ? pw.size(0) : 0, padding_idx, scale, d, current_stream(w)));
#endif
  } else {
    AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, w.scalar_type(), "embedding_fwd", [&] {
      cpu::embedding_fwd<scalar_t>(tok.data_ptr<int64_t>(), pos_ptr, w.data_ptr<scalar_t>(),
                                   has_pos ? pw.data_ptr<scalar_t>() : nullptr, out.data_ptr<scalar_t>(), n, dim,
                                   padding_idx, scale, d);
    });
  }
  return out;
}

#ifdef FLS_WITH_CUDA
// Deterministic gradient of one table on CUDA: pad rows get the key kNoGradKey (skipped), a stable sort
// groups equal keys in row order; the kernel sums each run in that order. No host sync anywhere.
void table_grad_cuda(const at::Tensor& grad, const at::Tensor& keys, const at::Tensor& pad_rows, at::Tensor& out,
                     bool keys_are_positions, double mult, const DropoutParams& d) {
  const auto k = keys.reshape({-1}).masked_fill(pad_rows, cuda::kNoGradKey);
  const auto sorted = at::sort(k, /*stable=*/true, /*dim=*/0, /*descending=*/false);
  const auto& sorted_keys = std::get<0>(sorted);
  const auto& order = std::get<1>(sorted);
  FLS_CHECK_LAUNCH(cuda::embedding_bwd_table(to_dtype(out.scalar_type()), grad.data_ptr(),
                                             sorted_keys.data_ptr<int64_t>(), order.data_ptr<int64_t>(), k.numel(),
                                             out.size(1), out.size(0), keys_are_positions, mult, d, out.data_ptr(),
                                             current_stream(out)));
}
#endif

// (dweight [num_weights, E], dpos_weight [num_positions, E]); a size of 0 skips that gradient.
std::tuple<at::Tensor, at::Tensor> embedding_bwd(const at::Tensor& grad, const at::Tensor& tokens,
                                                 const c10::optional<at::Tensor>& positions, int64_t num_weights,
                                                 int64_t num_positions, int64_t padding_idx, double scale, double p,
                                                 int64_t seed, int64_t offset) {
  check_float(grad, "embedding_bwd: grad");
  check_index(tokens, grad, "tokens");
  TORCH_CHECK(grad.dim() == tokens.dim() + 1, "embedding_bwd: grad must be tokens.shape + [dim], got ",
              grad.sizes(), " for tokens ", tokens.sizes());
  const int64_t dim = grad.size(-1);
  auto expect = tokens.sizes().vec();
  expect.push_back(dim);
  check_shape(grad, expect, "embedding_bwd: grad");
  TORCH_CHECK(num_weights >= 0 && num_positions >= 0, "embedding_bwd: num_weights and num_positions must be >= 0");
  const auto d = make_dropout(p, seed, offset);
  const auto g = grad.contiguous();
  const auto tok = tokens.contiguous();
  at::Tensor pos;
  if (num_positions > 0) {
    TORCH_CHECK(positions.has_value() && positions->defined(), "embedding_bwd: positions are required for dpos");
    pos = positions->contiguous();
    check_index(pos, tokens, "positions");
    check_shape(pos, tokens.sizes(), "embedding_bwd: positions");
  }
  // Forward already checked the ranges; they are checked again because a wrong key writes out of bounds
  // (on CUDA inside the kernel).
  if (num_weights > 0) check_range(tok, num_weights, "token id", "num_embeddings");
  if (num_positions > 0) check_range(pos, num_positions, "position", "max positions");
  // The CPU kernel writes every row (zeros where no token looks it up); the CUDA one only the rows it sums.
  auto dw = g.is_cuda() ? at::zeros({num_weights, dim}, g.options()) : at::empty({num_weights, dim}, g.options());
  auto dp = g.is_cuda() ? at::zeros({num_positions, dim}, g.options()) : at::empty({num_positions, dim}, g.options());
  const int64_t n = tok.numel();
  if (g.is_cuda()) {
#ifdef FLS_WITH_CUDA
    const c10::cuda::CUDAGuard guard(g.device());
    if (n > 0 && dim > 0 && (num_weights > 0 || num_positions > 0)) {
      const auto pad_rows = tok.reshape({-1}).eq(padding_idx);
      if (num_weights > 0) table_grad_cuda(g, tok, pad_rows, dw, /*keys_are_positions=*/false, scale, d);
      if (num_positions > 0) table_grad_cuda(g, pos, pad_rows, dp, /*keys_are_positions=*/true, 1.0, d);
    }
#endif
  } else {
    AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, g.scalar_type(), "embedding_bwd", [&] {
      if (num_weights > 0)
        cpu::embedding_bwd<scalar_t>(g.data_ptr<scalar_t>(), tok.data_ptr<int64_t>(), tok.data_ptr<int64_t>(),
                                     dw.data_ptr<scalar_t>(), n, dim, num_weights, padding_idx, scale, d);
      if (num_positions > 0)
        cpu::embedding_bwd<scalar_t>(g.data_ptr<scalar_t>(), pos.data_ptr<int64_t>(), tok.data_ptr<int64_t>(),
                                     dp.data_ptr<scalar_t>(), n, dim, num_positions, padding_idx, 1.0, d);
    });
  }
  return {dw, dp};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(fairseq_lightseq, m) {
  m.def(
      "embedding_fwd(Tensor tokens, Tensor weight, Tensor? pos_weight, Tensor? positions, int padding_idx, "
      "float scale, float p, int seed, int offset) -> Tensor");
  m.def(
      "embedding_bwd(Tensor grad, Tensor tokens, Tensor? positions, int num_weights, int num_positions, "
      "int padding_idx, float scale, float p, int seed, int offset) -> (Tensor dweight, Tensor dpos_weight)");
}

TORCH_LIBRARY_IMPL(fairseq_lightseq, CPU, m) {
  m.impl("embedding_fwd", &embedding_fwd);
  m.impl("embedding_bwd", &embedding_bwd);
}

#ifdef FLS_WITH_CUDA
TORCH_LIBRARY_IMPL(fairseq_lightseq, CUDA, m) {
  m.impl("embedding_fwd", &embedding_fwd);
  m.impl("embedding_bwd", &embedding_bwd);
}
#endif

}  // namespace fls
