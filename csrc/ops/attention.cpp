// Op layer of the attention family: the ops' schemas; per op, the argument checks and output allocation
// both devices share (<op>_prepare), then the CPU and the CUDA implementation, each registered under its own
// dispatch key.
//
//   attention_softmax_fwd(scores [B,H,Tq,Tk], key_padding_mask [B,Tk] bool or None, causal, scale, p, seed,
//                         offset, coords=[]) -> (y, out)
//     y   = softmax(scale * scores + masks), scores' dtype: returned to the user when dropout is off and
//           saved for backward in every case;
//     out = dropout(y) with the Philox stream (element index = flat index into [B,H,Tq,Tk], or the global index
//           under coords = [H_tot, h_off, Tq_tot, q_off, Tk_tot, k_off]: AttentionCoords in
//           ../kernels/attention.h) when floor(p * 2^24) > 0, else an empty tensor (shape [0]).
//   attention_softmax_bwd(dout, y, scale, p, seed, offset, coords=[]) -> dscores (the mask is regenerated).
//   attention_dropout(y, p, seed, offset, coords=[]) -> out: the forward's `out` again from y (the same mask),
//     so that backward need not keep it; a copy of y when dropout is off (callers skip the call then: an op's
//     output must not alias its input).
//   qkv_bias_split(qkv [T,B,3E], bias [3E], num_heads) -> (q, k, v) each [B*heads, T, E/heads];
//   qkv_bias_split_bwd(dq, dk, dv, num_heads) -> (dqkv [T,B,3E], dbias [3E]);
//   merge_heads(x [B*heads,T,hd], num_heads) -> [T,B,heads*hd]. Its backward is a view of dy (Python).
#include <cmath>

#include "../kernels/attention.h"
#include "device.h"

namespace fls {
namespace {

inline void check_softmax_scale(double scale, const char* op) {
  TORCH_CHECK(std::isfinite(scale), op, ": scale must be finite, got ", scale);
}

// The dropout coordinates of local scores [., H, Tq, Tk]: the default (H, 0, Tq, 0, Tk, 0) when `coords` is
// empty, else its 6 values (H_tot, h_off, Tq_tot, q_off, Tk_tot, k_off), all >= 0 and the totals >= 1. Local
// rows or keys beyond the totals are allowed (sequence parallelism's padding rows).
inline AttentionCoords attention_coords(at::IntArrayRef coords, int64_t H, int64_t Tq, int64_t Tk, const char* op) {
  if (coords.empty()) return {.H = H, .Tq = Tq, .H_tot = H, .h_off = 0, .Tq_tot = Tq, .q_off = 0, .Tk_tot = Tk,
                              .k_off = 0};
  TORCH_CHECK(coords.size() == 6, op,
              ": coords must be empty or 6 ints (H_tot, h_off, Tq_tot, q_off, Tk_tot, k_off), got ", coords.size(),
              " values ", coords);
  for (int64_t v : coords) TORCH_CHECK(v >= 0, op, ": coords must be >= 0, got ", coords);
  TORCH_CHECK(coords[0] >= 1 && coords[2] >= 1 && coords[4] >= 1, op,
              ": coords' H_tot, Tq_tot, Tk_tot must be >= 1, got ", coords);
  return {.H = H, .Tq = Tq, .H_tot = coords[0], .h_off = coords[1], .Tq_tot = coords[2], .q_off = coords[3],
          .Tk_tot = coords[4], .k_off = coords[5]};
}

struct AttentionSoftmaxFwd {
  at::Tensor scores, key_padding_mask;  // mask undefined when absent
  at::Tensor y, out;
  AttentionSoftmaxFwdParams params;
};

inline AttentionSoftmaxFwd attention_softmax_fwd_prepare(const at::Tensor& scores,
                                                         const c10::optional<at::Tensor>& key_padding_mask,
                                                         bool causal, double scale, double p, int64_t seed,
                                                         int64_t offset, at::IntArrayRef coords) {
  check_float(scores, "attention_softmax: scores");
  TORCH_CHECK(scores.dim() == 4, "attention_softmax: scores must be 4-D [B, H, Tq, Tk], got shape ", scores.sizes());
  check_softmax_scale(scale, "attention_softmax");
  const int64_t B = scores.size(0), H = scores.size(1), Tq = scores.size(2), Tk = scores.size(3);
  const DropoutParams d = make_dropout(p, seed, offset);
  const AttentionCoords c = attention_coords(coords, H, Tq, Tk, "attention_softmax");
  AttentionSoftmaxFwd op;
  if (key_padding_mask.has_value() && key_padding_mask->defined()) {
    const at::Tensor& mask = *key_padding_mask;
    TORCH_CHECK(mask.scalar_type() == at::kBool, "attention_softmax: key_padding_mask must be bool (True = pad), got ",
                mask.scalar_type());
    TORCH_CHECK(mask.device() == scores.device(), "attention_softmax: key_padding_mask is on ", mask.device(),
                " but scores is on ", scores.device());
    check_shape(mask, {B, Tk}, "attention_softmax: key_padding_mask");
    op.key_padding_mask = mask.contiguous();
  }
  const bool drop = d.threshold != 0;
  op.scores = scores.contiguous();
  op.y = at::empty_like(op.scores);
  op.out = drop ? at::empty_like(op.scores) : at::empty({0}, op.scores.options());
  op.params = {.dtype = to_dtype(scores.scalar_type()), .scores = op.scores.data_ptr(),
               .key_padding_mask = op.key_padding_mask.defined() ? op.key_padding_mask.data_ptr<bool>() : nullptr,
               .y = op.y.data_ptr(), .out = drop ? op.out.data_ptr() : nullptr, .B = B, .H = H, .Tq = Tq, .Tk = Tk,
               .causal = causal, .scale = scale, .drop = d, .coords = c};
  return op;
}

struct AttentionSoftmaxBwd {
  at::Tensor dout, y;
  at::Tensor dscores;
  AttentionSoftmaxBwdParams params;
};

inline AttentionSoftmaxBwd attention_softmax_bwd_prepare(const at::Tensor& dout, const at::Tensor& y, double scale,
                                                         double p, int64_t seed, int64_t offset,
                                                         at::IntArrayRef coords) {
  check_float(y, "attention_softmax_bwd: y");
  check_same(dout, y, "attention_softmax_bwd: dout", "y");
  TORCH_CHECK(y.dim() == 4, "attention_softmax_bwd: y must be 4-D [B, H, Tq, Tk], got shape ", y.sizes());
  check_shape(dout, y.sizes(), "attention_softmax_bwd: dout");
  check_softmax_scale(scale, "attention_softmax_bwd");
  const DropoutParams d = make_dropout(p, seed, offset);
  const int64_t Tk = y.size(3);
  const AttentionCoords c = attention_coords(coords, y.size(1), y.size(2), Tk, "attention_softmax_bwd");
  AttentionSoftmaxBwd op;
  op.y = y.contiguous();
  op.dout = dout.contiguous();
  op.dscores = at::empty_like(op.y);
  op.params = {.dtype = to_dtype(y.scalar_type()), .dout = op.dout.data_ptr(), .y = op.y.data_ptr(),
               .dscores = op.dscores.data_ptr(), .rows = Tk == 0 ? 0 : y.numel() / Tk, .Tk = Tk, .scale = scale,
               .drop = d, .coords = c};
  return op;
}

struct AttentionDropout {
  at::Tensor y, out;
  AttentionDropoutParams params;
};

inline AttentionDropout attention_dropout_prepare(const at::Tensor& y, double p, int64_t seed, int64_t offset,
                                                  at::IntArrayRef coords) {
  check_float(y, "attention_dropout: y");
  TORCH_CHECK(y.dim() == 4, "attention_dropout: y must be 4-D [B, H, Tq, Tk], got shape ", y.sizes());
  const DropoutParams d = make_dropout(p, seed, offset);
  const int64_t Tk = y.size(3);
  AttentionDropout op;
  op.y = y.contiguous();
  op.out = d.threshold != 0 ? at::empty_like(op.y) : op.y.clone();
  op.params = {.dtype = to_dtype(y.scalar_type()), .y = op.y.data_ptr(), .out = op.out.data_ptr(),
               .rows = Tk == 0 ? 0 : y.numel() / Tk, .Tk = Tk, .drop = d,
               .coords = attention_coords(coords, y.size(1), y.size(2), Tk, "attention_dropout")};
  return op;
}

// Head size for E channels split into num_heads, with messages naming the argument.
inline int64_t head_dim(int64_t E, int64_t num_heads, const char* op, const char* what) {
  TORCH_CHECK(num_heads > 0, op, ": num_heads must be > 0, got ", num_heads);
  TORCH_CHECK(E % num_heads == 0, op, ": num_heads ", num_heads, " must divide the embedding dim E = ", E, " (",
              what, ")");
  return E / num_heads;
}

// B from a head-major [B*heads, T, hd] tensor, with messages naming the argument.
inline int64_t batch_of_heads(const at::Tensor& t, int64_t num_heads, const char* op, const char* name) {
  TORCH_CHECK(t.dim() == 3, op, ": ", name, " must be 3-D [B*heads, T, head_dim], got shape ", t.sizes());
  TORCH_CHECK(num_heads > 0, op, ": num_heads must be > 0, got ", num_heads);
  TORCH_CHECK(t.size(0) % num_heads == 0, op, ": num_heads ", num_heads, " must divide ", name,
              ".size(0) = B*heads = ", t.size(0));
  return t.size(0) / num_heads;
}

struct QkvBiasSplit {
  at::Tensor qkv, bias;
  at::Tensor q, k, v;
  QkvBiasSplitParams params;
};

inline QkvBiasSplit qkv_bias_split_prepare(const at::Tensor& qkv, const at::Tensor& bias, int64_t num_heads) {
  check_float(qkv, "qkv_bias_split: qkv");
  check_same(bias, qkv, "qkv_bias_split: bias", "qkv");
  TORCH_CHECK(qkv.dim() == 3, "qkv_bias_split: qkv must be 3-D [T, B, 3*E], got shape ", qkv.sizes());
  const int64_t T = qkv.size(0), B = qkv.size(1), E3 = qkv.size(2);
  TORCH_CHECK(E3 % 3 == 0, "qkv_bias_split: qkv's last dim must be 3*E, got ", E3, " (not a multiple of 3)");
  const int64_t hd = head_dim(E3 / 3, num_heads, "qkv_bias_split", "qkv.size(2) / 3");
  check_shape(bias, {E3}, "qkv_bias_split: bias");
  QkvBiasSplit op;
  op.qkv = qkv.contiguous();
  op.bias = bias.contiguous();
  op.q = at::empty({B * num_heads, T, hd}, qkv.options());
  op.k = at::empty_like(op.q);
  op.v = at::empty_like(op.q);
  op.params = {.dtype = to_dtype(qkv.scalar_type()), .qkv = op.qkv.data_ptr(), .bias = op.bias.data_ptr(),
               .q = op.q.data_ptr(), .k = op.k.data_ptr(), .v = op.v.data_ptr(), .T = T, .B = B, .H = num_heads,
               .head_dim = hd};
  return op;
}

struct QkvBiasSplitBwd {
  at::Tensor dq, dk, dv;
  at::Tensor dqkv, dbias;
  QkvBiasSplitBwdParams params;
};

inline QkvBiasSplitBwd qkv_bias_split_bwd_prepare(const at::Tensor& dq, const at::Tensor& dk, const at::Tensor& dv,
                                                  int64_t num_heads) {
  check_float(dq, "qkv_bias_split_bwd: dq");
  check_same(dk, dq, "qkv_bias_split_bwd: dk", "dq");
  check_same(dv, dq, "qkv_bias_split_bwd: dv", "dq");
  const int64_t B = batch_of_heads(dq, num_heads, "qkv_bias_split_bwd", "dq");
  check_shape(dk, dq.sizes(), "qkv_bias_split_bwd: dk");
  check_shape(dv, dq.sizes(), "qkv_bias_split_bwd: dv");
  const int64_t T = dq.size(1), hd = dq.size(2), E = num_heads * hd;
  QkvBiasSplitBwd op;
  op.dq = dq.contiguous();
  op.dk = dk.contiguous();
  op.dv = dv.contiguous();
  op.dqkv = at::empty({T, B, 3 * E}, dq.options());
  op.dbias = at::empty({3 * E}, dq.options());
  op.params = {.dtype = to_dtype(dq.scalar_type()), .dq = op.dq.data_ptr(), .dk = op.dk.data_ptr(),
               .dv = op.dv.data_ptr(), .dqkv = op.dqkv.data_ptr(), .dbias = op.dbias.data_ptr(), .T = T, .B = B,
               .H = num_heads, .head_dim = hd};
  return op;
}

struct MergeHeads {
  at::Tensor x;
  at::Tensor y;
  MergeHeadsParams params;
};

inline MergeHeads merge_heads_prepare(const at::Tensor& x, int64_t num_heads) {
  check_float(x, "merge_heads: x");
  const int64_t B = batch_of_heads(x, num_heads, "merge_heads", "x");
  const int64_t T = x.size(1), hd = x.size(2);
  MergeHeads op;
  op.x = x.contiguous();
  op.y = at::empty({T, B, num_heads * hd}, x.options());
  op.params = {.dtype = to_dtype(x.scalar_type()), .x = op.x.data_ptr(), .y = op.y.data_ptr(), .T = T, .B = B,
               .H = num_heads, .head_dim = hd};
  return op;
}

// ---- CPU
std::tuple<at::Tensor, at::Tensor> attention_softmax_fwd_cpu(const at::Tensor& scores,
                                                             const c10::optional<at::Tensor>& key_padding_mask,
                                                             bool causal, double scale, double p, int64_t seed,
                                                             int64_t offset, at::IntArrayRef coords) {
  auto op = attention_softmax_fwd_prepare(scores, key_padding_mask, causal, scale, p, seed, offset, coords);
  cpu::attention_softmax_fwd(op.params);
  return {op.y, op.out};
}

at::Tensor attention_softmax_bwd_cpu(const at::Tensor& dout, const at::Tensor& y, double scale, double p, int64_t seed,
                                     int64_t offset, at::IntArrayRef coords) {
  auto op = attention_softmax_bwd_prepare(dout, y, scale, p, seed, offset, coords);
  cpu::attention_softmax_bwd(op.params);
  return op.dscores;
}

at::Tensor attention_dropout_cpu(const at::Tensor& y, double p, int64_t seed, int64_t offset, at::IntArrayRef coords) {
  auto op = attention_dropout_prepare(y, p, seed, offset, coords);
  cpu::attention_dropout(op.params);
  return op.out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> qkv_bias_split_cpu(const at::Tensor& qkv, const at::Tensor& bias,
                                                                  int64_t num_heads) {
  auto op = qkv_bias_split_prepare(qkv, bias, num_heads);
  cpu::qkv_bias_split(op.params);
  return {op.q, op.k, op.v};
}

std::tuple<at::Tensor, at::Tensor> qkv_bias_split_bwd_cpu(const at::Tensor& dq, const at::Tensor& dk,
                                                          const at::Tensor& dv, int64_t num_heads) {
  auto op = qkv_bias_split_bwd_prepare(dq, dk, dv, num_heads);
  cpu::qkv_bias_split_bwd(op.params);
  return {op.dqkv, op.dbias};
}

at::Tensor merge_heads_cpu(const at::Tensor& x, int64_t num_heads) {
  auto op = merge_heads_prepare(x, num_heads);
  // A lone head merge is a plain permutation with nothing to fuse: on CPU, ATen's strided copy
  // measured faster than our row loop (0.41 vs 0.51 ms at 4096 x 512, 2 threads), so it does it.
  const auto& q = op.params;
  op.y.view({q.T, q.B, q.H, q.head_dim}).copy_(op.x.view({q.B, q.H, q.T, q.head_dim}).permute({2, 0, 1, 3}));
  return op.y;
}

// ---- CUDA (registered only in a CUDA build)
std::tuple<at::Tensor, at::Tensor> attention_softmax_fwd_cuda(const at::Tensor& scores,
                                                              const c10::optional<at::Tensor>& key_padding_mask,
                                                              bool causal, double scale, double p, int64_t seed,
                                                              int64_t offset, at::IntArrayRef coords) {
  const c10::DeviceGuard guard(scores.device());
  auto op = attention_softmax_fwd_prepare(scores, key_padding_mask, causal, scale, p, seed, offset, coords);
  const int64_t rows = op.params.B * op.params.H * op.params.Tq;
  TORCH_CHECK(rows <= kMaxRows32, "attention_softmax: at most 2^31-1 rows (B*H*Tq) on CUDA, got ", rows);
  FLS_CHECK_LAUNCH(cuda::attention_softmax_fwd(op.params, stream_of(scores)));
  return {op.y, op.out};
}

at::Tensor attention_softmax_bwd_cuda(const at::Tensor& dout, const at::Tensor& y, double scale, double p, int64_t seed,
                                      int64_t offset, at::IntArrayRef coords) {
  const c10::DeviceGuard guard(y.device());
  auto op = attention_softmax_bwd_prepare(dout, y, scale, p, seed, offset, coords);
  TORCH_CHECK(op.params.rows <= kMaxRows32, "attention_softmax_bwd: at most 2^31-1 rows (B*H*Tq) on CUDA, got ",
              op.params.rows);
  FLS_CHECK_LAUNCH(cuda::attention_softmax_bwd(op.params, stream_of(y)));
  return op.dscores;
}

at::Tensor attention_dropout_cuda(const at::Tensor& y, double p, int64_t seed, int64_t offset,
                                  at::IntArrayRef coords) {
  const c10::DeviceGuard guard(y.device());
  auto op = attention_dropout_prepare(y, p, seed, offset, coords);
  TORCH_CHECK(op.params.rows <= kMaxRows32, "attention_dropout: at most 2^31-1 rows (B*H*Tq) on CUDA, got ",
              op.params.rows);
  FLS_CHECK_LAUNCH(cuda::attention_dropout(op.params, stream_of(y)));
  return op.out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> qkv_bias_split_cuda(const at::Tensor& qkv, const at::Tensor& bias,
                                                                   int64_t num_heads) {
  const c10::DeviceGuard guard(qkv.device());
  auto op = qkv_bias_split_prepare(qkv, bias, num_heads);
  FLS_CHECK_LAUNCH(cuda::qkv_bias_split(op.params, stream_of(qkv)));
  return {op.q, op.k, op.v};
}

std::tuple<at::Tensor, at::Tensor> qkv_bias_split_bwd_cuda(const at::Tensor& dq, const at::Tensor& dk,
                                                           const at::Tensor& dv, int64_t num_heads) {
  const c10::DeviceGuard guard(dq.device());
  auto op = qkv_bias_split_bwd_prepare(dq, dk, dv, num_heads);
  const auto& q = op.params;
  auto ws = workspace(cuda::qkv_bias_split_bwd_workspace(q.T * q.B, 3 * q.H * q.head_dim), dq);
  FLS_CHECK_LAUNCH(cuda::qkv_bias_split_bwd(op.params, ws.data_ptr<float>(), stream_of(dq)));
  return {op.dqkv, op.dbias};
}

at::Tensor merge_heads_cuda(const at::Tensor& x, int64_t num_heads) {
  const c10::DeviceGuard guard(x.device());
  auto op = merge_heads_prepare(x, num_heads);
  FLS_CHECK_LAUNCH(cuda::merge_heads(op.params, stream_of(x)));
  return op.y;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(fairseq_lightseq, m) {
  m.def(
      "attention_softmax_fwd(Tensor scores, Tensor? key_padding_mask, bool causal, float scale, float p, int seed, "
      "int offset, int[] coords=[]) -> (Tensor y, Tensor out)");
  m.def(
      "attention_softmax_bwd(Tensor dout, Tensor y, float scale, float p, int seed, int offset, int[] coords=[]) -> "
      "Tensor");
  m.def("attention_dropout(Tensor y, float p, int seed, int offset, int[] coords=[]) -> Tensor");
  m.def("qkv_bias_split(Tensor qkv, Tensor bias, int num_heads) -> (Tensor q, Tensor k, Tensor v)");
  m.def("qkv_bias_split_bwd(Tensor dq, Tensor dk, Tensor dv, int num_heads) -> (Tensor dqkv, Tensor dbias)");
  m.def("merge_heads(Tensor x, int num_heads) -> Tensor");
}

TORCH_LIBRARY_IMPL(fairseq_lightseq, CPU, m) {
  m.impl("attention_softmax_fwd", FLS_CPU_IMPL(attention_softmax_fwd));
  m.impl("attention_softmax_bwd", FLS_CPU_IMPL(attention_softmax_bwd));
  m.impl("attention_dropout", FLS_CPU_IMPL(attention_dropout));
  m.impl("qkv_bias_split", FLS_CPU_IMPL(qkv_bias_split));
  m.impl("qkv_bias_split_bwd", FLS_CPU_IMPL(qkv_bias_split_bwd));
  m.impl("merge_heads", FLS_CPU_IMPL(merge_heads));
}

TORCH_LIBRARY_IMPL(fairseq_lightseq, CUDA, m) {
  if (!kWithCuda) return;
  m.impl("attention_softmax_fwd", &attention_softmax_fwd_cuda);
  m.impl("attention_softmax_bwd", &attention_softmax_bwd_cuda);
  m.impl("attention_dropout", &attention_dropout_cuda);
  m.impl("qkv_bias_split", &qkv_bias_split_cuda);
  m.impl("qkv_bias_split_bwd", &qkv_bias_split_bwd_cuda);
  m.impl("merge_heads", &merge_heads_cuda);
}

}  // namespace fls
