// Op layer of the embedding family: the ops' schemas; per op, the argument checks (dtypes, shapes) and
// output allocation both devices share (<op>_prepare), then the CPU and the CUDA implementation, each
// registered under its own dispatch key. Token/position ranges are checked by the CPU implementation on the
// host (check_range) and inside the kernels on CUDA: a host check there would copy a device min/max to the
// host, one stream sync per call.
#include <algorithm>
#include <utility>

#include "../kernels/embedding.h"
#include "device.h"

namespace fls {
namespace {

inline void check_index(const at::Tensor& t, const at::Tensor& tokens, const char* name) {
  TORCH_CHECK(t.scalar_type() == at::kLong, "embedding: ", name, " must be int64, got ", t.scalar_type());
  TORCH_CHECK(t.device() == tokens.device(), "embedding: ", name, " is on ", t.device(), " but tokens is on ",
              tokens.device());
}

// Every id of the CPU int64 tensor t in [0, limit), else an error naming the first bound it breaks.
inline void check_range(const at::Tensor& t, int64_t limit, const char* what, const char* limit_name) {
  TORCH_INTERNAL_ASSERT(t.device().is_cpu(), "embedding: check_range is the CPU range check");
  if (t.numel() == 0) return;
  const auto c = t.contiguous();
  const int64_t* p = c.data_ptr<int64_t>();
  const auto mm = std::minmax_element(p, p + c.numel());
  TORCH_CHECK(*mm.first >= 0, "embedding: ", what, " ", *mm.first, " is negative");
  TORCH_CHECK(*mm.second < limit, "embedding: ", what, " ", *mm.second, " exceeds ", limit_name, " ", limit,
              " (valid: 0..", limit - 1, ")");
}

// One embedding_fwd call: out [B, T, E] = dropout(scale * weight[tokens] + pos_weight[positions]); zeros at
// pad tokens. With rows (int64 [B*T]) the dropout of output row r (= b*T + t) is padded row rows[r]'s.
struct EmbeddingFwd {
  at::Tensor tokens, weight, pos_weight, positions;  // pos_weight, positions undefined without positions
  at::Tensor rows;                                   // the dropout row map, undefined without one
  at::Tensor out;
  EmbeddingFwdParams params;
};

inline EmbeddingFwd embedding_fwd_prepare(const at::Tensor& tokens, const at::Tensor& weight,
                                          const c10::optional<at::Tensor>& pos_weight,
                                          const c10::optional<at::Tensor>& positions, int64_t padding_idx,
                                          double scale, double p, int64_t seed, int64_t offset,
                                          const c10::optional<at::Tensor>& rows) {
  check_float(weight, "embedding: weight");
  TORCH_CHECK(weight.dim() == 2, "embedding: weight must be [num_embeddings, dim], got shape ", weight.sizes());
  check_index(tokens, weight, "tokens");
  const int64_t dim = weight.size(1);
  const bool has_pos = pos_weight.has_value() && pos_weight->defined();
  EmbeddingFwd op;
  if (has_pos) {
    op.pos_weight = pos_weight->contiguous();
    check_same(op.pos_weight, weight, "embedding: pos_weight", "weight");
    TORCH_CHECK(op.pos_weight.dim() == 2 && op.pos_weight.size(1) == dim, "embedding: pos_weight must be [max_positions, ",
                dim, "], got shape ", op.pos_weight.sizes());
    TORCH_CHECK(positions.has_value() && positions->defined(), "embedding: positions are required with pos_weight");
    op.positions = positions->contiguous();
    check_index(op.positions, tokens, "positions");
    check_shape(op.positions, tokens.sizes(), "embedding: positions");
  }
  const DropoutParams d = make_dropout(p, seed, offset);
  op.rows = dropout_rows(rows, tokens.numel(), dim, d, tokens, "embedding");
  op.tokens = tokens.contiguous();
  op.weight = weight.contiguous();
  auto out_sizes = op.tokens.sizes().vec();
  out_sizes.push_back(dim);
  op.out = at::empty(out_sizes, op.weight.options());
  op.params = {.dtype = to_dtype(weight.scalar_type()), .tokens = op.tokens.data_ptr<int64_t>(),
               .positions = has_pos ? op.positions.data_ptr<int64_t>() : nullptr, .weight = op.weight.data_ptr(),
               .pos_weight = has_pos ? op.pos_weight.data_ptr() : nullptr, .out = op.out.data_ptr(),
               .n = op.tokens.numel(), .dim = dim, .num_embeddings = op.weight.size(0),
               .num_positions = has_pos ? op.pos_weight.size(0) : 0, .padding_idx = padding_idx, .scale = scale,
               .drop = d, .row_map = rows_ptr(op.rows)};
  return op;
}

// One embedding_bwd call: (dweight [num_weights, E], dpos_weight [num_positions, E]); a size of 0 skips that
// gradient. Both tables' params are filled; keys are tokens for dweight and positions for dpos_weight.
struct EmbeddingBwd {
  at::Tensor grad, tokens, positions;  // positions undefined when num_positions == 0
  at::Tensor rows;                     // the dropout row map, undefined without one
  at::Tensor dweight, dpos_weight;     // uninitialised: the CUDA implementation zero-fills them
  EmbeddingTableGradParams weight_grad, pos_grad;
};

inline EmbeddingBwd embedding_bwd_prepare(const at::Tensor& grad, const at::Tensor& tokens,
                                          const c10::optional<at::Tensor>& positions, int64_t num_weights,
                                          int64_t num_positions, int64_t padding_idx, double scale, double p,
                                          int64_t seed, int64_t offset, const c10::optional<at::Tensor>& rows) {
  check_float(grad, "embedding_bwd: grad");
  check_index(tokens, grad, "tokens");
  TORCH_CHECK(grad.dim() == tokens.dim() + 1, "embedding_bwd: grad must be tokens.shape + [dim], got ",
              grad.sizes(), " for tokens ", tokens.sizes());
  const int64_t dim = grad.size(-1);
  auto expect = tokens.sizes().vec();
  expect.push_back(dim);
  check_shape(grad, expect, "embedding_bwd: grad");
  TORCH_CHECK(num_weights >= 0 && num_positions >= 0, "embedding_bwd: num_weights and num_positions must be >= 0");
  const DropoutParams d = make_dropout(p, seed, offset);
  EmbeddingBwd op;
  op.rows = dropout_rows(rows, tokens.numel(), dim, d, tokens, "embedding_bwd");
  op.grad = grad.contiguous();
  op.tokens = tokens.contiguous();
  if (num_positions > 0) {
    TORCH_CHECK(positions.has_value() && positions->defined(), "embedding_bwd: positions are required for dpos");
    op.positions = positions->contiguous();
    check_index(op.positions, tokens, "positions");
    check_shape(op.positions, tokens.sizes(), "embedding_bwd: positions");
  }
  op.dweight = at::empty({num_weights, dim}, op.grad.options());
  op.dpos_weight = at::empty({num_positions, dim}, op.grad.options());
  const EmbeddingTableGradParams common = {
      .dtype = to_dtype(grad.scalar_type()), .grad = op.grad.data_ptr(), .keys = nullptr,
      .tokens = op.tokens.data_ptr<int64_t>(), .out = nullptr, .n = op.tokens.numel(), .dim = dim, .num_rows = 0,
      .padding_idx = padding_idx, .keys_are_positions = false, .mult = 1.0, .drop = d,
      .row_map = rows_ptr(op.rows)};
  op.weight_grad = common;
  op.weight_grad.keys = op.tokens.data_ptr<int64_t>();
  op.weight_grad.out = op.dweight.data_ptr();
  op.weight_grad.num_rows = num_weights;
  op.weight_grad.mult = scale;
  op.pos_grad = common;
  op.pos_grad.keys = num_positions > 0 ? op.positions.data_ptr<int64_t>() : nullptr;
  op.pos_grad.out = op.dpos_weight.data_ptr();
  op.pos_grad.num_rows = num_positions;
  op.pos_grad.keys_are_positions = true;
  return op;
}

// ---- CPU (ids range-checked here on the host; the CUDA kernels check them on the device)
at::Tensor embedding_fwd_cpu(const at::Tensor& tokens, const at::Tensor& weight,
                             const c10::optional<at::Tensor>& pos_weight, const c10::optional<at::Tensor>& positions,
                             int64_t padding_idx, double scale, double p, int64_t seed, int64_t offset,
                             const c10::optional<at::Tensor>& rows) {
  auto op = embedding_fwd_prepare(tokens, weight, pos_weight, positions, padding_idx, scale, p, seed, offset, rows);
  check_range(op.tokens, op.params.num_embeddings, "token id", "num_embeddings");
  if (op.positions.defined()) check_range(op.positions, op.params.num_positions, "position", "max positions");
  cpu::embedding_fwd(op.params);
  return op.out;
}

std::tuple<at::Tensor, at::Tensor> embedding_bwd_cpu(const at::Tensor& grad, const at::Tensor& tokens,
                                                     const c10::optional<at::Tensor>& positions, int64_t num_weights,
                                                     int64_t num_positions, int64_t padding_idx, double scale, double p,
                                                     int64_t seed, int64_t offset,
                                                     const c10::optional<at::Tensor>& rows) {
  auto op = embedding_bwd_prepare(grad, tokens, positions, num_weights, num_positions, padding_idx, scale, p, seed,
                                  offset, rows);
  // Forward already checked the ranges; they are checked again because a wrong key writes out of bounds.
  if (num_weights > 0) check_range(op.tokens, num_weights, "token id", "num_embeddings");
  if (num_positions > 0) check_range(op.positions, num_positions, "position", "max positions");
  if (num_weights > 0) cpu::embedding_table_grad(op.weight_grad);
  if (num_positions > 0) cpu::embedding_table_grad(op.pos_grad);
  return {op.dweight, op.dpos_weight};
}

// ---- CUDA (registered only in a CUDA build; ids range-checked inside the kernels: a host check would sync
// the stream)
at::Tensor embedding_fwd_cuda(const at::Tensor& tokens, const at::Tensor& weight,
                              const c10::optional<at::Tensor>& pos_weight, const c10::optional<at::Tensor>& positions,
                              int64_t padding_idx, double scale, double p, int64_t seed, int64_t offset,
                              const c10::optional<at::Tensor>& rows) {
  const c10::DeviceGuard guard(weight.device());
  auto op = embedding_fwd_prepare(tokens, weight, pos_weight, positions, padding_idx, scale, p, seed, offset, rows);
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

std::tuple<at::Tensor, at::Tensor> embedding_bwd_cuda(const at::Tensor& grad, const at::Tensor& tokens,
                                                      const c10::optional<at::Tensor>& positions, int64_t num_weights,
                                                      int64_t num_positions, int64_t padding_idx, double scale,
                                                      double p, int64_t seed, int64_t offset,
                                                      const c10::optional<at::Tensor>& rows) {
  const c10::DeviceGuard guard(grad.device());
  auto op = embedding_bwd_prepare(grad, tokens, positions, num_weights, num_positions, padding_idx, scale, p, seed,
                                  offset, rows);
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

}  // namespace

TORCH_LIBRARY_FRAGMENT(fairseq_lightseq, m) {
  m.def(
      "embedding_fwd(Tensor tokens, Tensor weight, Tensor? pos_weight, Tensor? positions, int padding_idx, "
      "float scale, float p, int seed, int offset, Tensor? rows=None) -> Tensor");
  m.def(
      "embedding_bwd(Tensor grad, Tensor tokens, Tensor? positions, int num_weights, int num_positions, "
      "int padding_idx, float scale, float p, int seed, int offset, Tensor? rows=None) -> (Tensor dweight, "
      "Tensor dpos_weight)");
}

TORCH_LIBRARY_IMPL(fairseq_lightseq, CPU, m) {
  m.impl("embedding_fwd", FLS_CPU_IMPL(embedding_fwd));
  m.impl("embedding_bwd", FLS_CPU_IMPL(embedding_bwd));
}

TORCH_LIBRARY_IMPL(fairseq_lightseq, CUDA, m) {
  if (!kWithCuda) return;
  m.impl("embedding_fwd", &embedding_fwd_cuda);
  m.impl("embedding_bwd", &embedding_bwd_cuda);
}

}  // namespace fls
