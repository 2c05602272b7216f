// Op layer of the varlen-attention op group (attention over packed rows): the ops' schemas; per op, the argument
// checks and output allocation both devices share (<op>_prepare), then the CPU and the CUDA implementation.
//
//   varlen_attention_fwd(q [Nq,H,D], k [Nk,H,D], v [Nk,H,D], cu_seqlens_q [B+1] int32, cu_seqlens_k [B+1] int32,
//                        max_seqlen_q, max_seqlen_k, causal, scale, p, seed, offset, starts [B,2] int32 or None,
//                        padded_q, padded_k) -> (out [Nq,H,D], lse [Nq,H] fp32 (fp64 for fp64))
//   varlen_attention_bwd(dout, q, k, v, out, lse, <the forward's other arguments>) -> (dq, dk, dv)
// starts, padded_q, padded_k place every sentence in the padded [B, H, padded_q, padded_k] problem whose dropout
// stream the op draws (VarlenProblem in ../kernels/varlen_attention.h); padded_q/padded_k 0 mean max_seqlen_q/k.
// The CPU checks the offsets' values; on CUDA reading them would wait for the device, so only their shapes are
// checked there and the kernels assert on the values.
#include <cmath>

#include "../kernels/varlen_attention.h"
#include "device.h"

namespace fls {
namespace {

// An int32 [n] or [n, 2] metadata tensor on q's device, contiguous.
inline at::Tensor check_index(const at::Tensor& t, const at::Tensor& q, at::IntArrayRef shape, const char* name) {
  TORCH_CHECK(t.scalar_type() == at::kInt, "varlen_attention: ", name, " must be int32, got ", t.scalar_type());
  TORCH_CHECK(t.device() == q.device(), "varlen_attention: ", name, " is on ", t.device(), " but q is on ",
              q.device());
  TORCH_CHECK(t.sizes() == shape, "varlen_attention: ", name, " must have shape ", shape, ", got ", t.sizes());
  return t.contiguous();
}

// CPU only: cu_seqlens' values (0 first, non-decreasing, N last) and lengths within max_seqlen.
inline void check_offsets_values(const at::Tensor& cu, int64_t N, int64_t max_seqlen, const char* name) {
  const int32_t* c = cu.data_ptr<int32_t>();
  const int64_t B = cu.numel() - 1;
  TORCH_CHECK(c[0] == 0, "varlen_attention: ", name, "[0] must be 0, got ", c[0]);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t len = static_cast<int64_t>(c[b + 1]) - c[b];
    TORCH_CHECK(len >= 0, "varlen_attention: ", name, " must be non-decreasing, got ", name, "[", b + 1, "] = ",
                c[b + 1], " < ", c[b]);
    TORCH_CHECK(len <= max_seqlen, "varlen_attention: sentence ", b, " has ", len, " rows in ", name,
                ", more than max_seqlen ", max_seqlen);
  }
  TORCH_CHECK(c[B] == N, "varlen_attention: ", name, "[-1] must be the row count ", N, ", got ", c[B]);
}

// An output shaped like x whose rows the kernel writes where a sentence owns them. On CUDA, where the offsets'
// values are not checked, rows no sentence owns are possible and keep `fill` (the output 0, the log-sum-exp
// -inf, as for an empty sentence's rows); on the CPU the checks make every row a sentence's, so the kernel
// writes them all (empty: no extra pass over the output).
inline at::Tensor owned_rows_output(const at::Tensor& x, at::IntArrayRef sizes, at::ScalarType dtype, double fill) {
  const auto options = x.options().dtype(dtype);
  return runs_cuda(x) ? at::full(sizes, fill, options) : at::empty(sizes, options);
}
inline at::Tensor owned_rows_output(const at::Tensor& x) { return owned_rows_output(x, x.sizes(), x.scalar_type(), 0.0); }

// The tensors a VarlenProblem points into.
struct VarlenIndex {
  at::Tensor cu_q, cu_k, starts;
  VarlenProblem s;
};

inline VarlenIndex varlen_prepare(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k, int64_t max_seqlen_q,
                                  int64_t max_seqlen_k, bool causal, double scale, double p, int64_t seed,
                                  int64_t offset, const c10::optional<at::Tensor>& starts, int64_t padded_q,
                                  int64_t padded_k) {
  check_float(q, "varlen_attention: q");
  check_same(k, q, "varlen_attention: k", "q");
  check_same(v, q, "varlen_attention: v", "q");
  TORCH_CHECK(q.dim() == 3, "varlen_attention: q must be 3-D [Nq, H, D], got shape ", q.sizes());
  TORCH_CHECK(k.dim() == 3, "varlen_attention: k must be 3-D [Nk, H, D], got shape ", k.sizes());
  const int64_t H = q.size(1), D = q.size(2);
  TORCH_CHECK(H >= 1 && D >= 1, "varlen_attention: q must have H >= 1 heads and head dim D >= 1, got shape ",
              q.sizes());
  TORCH_CHECK(k.size(1) == H && k.size(2) == D, "varlen_attention: k must have shape [Nk, ", H, ", ", D,
              "] (q's heads and head dim), got ", k.sizes());
  check_shape(v, k.sizes(), "varlen_attention: v");
  TORCH_CHECK(cu_seqlens_q.dim() == 1 && cu_seqlens_q.numel() >= 2,
              "varlen_attention: cu_seqlens_q must be 1-D [B+1] with B >= 1, got shape ", cu_seqlens_q.sizes());
  const int64_t B = cu_seqlens_q.numel() - 1;
  TORCH_CHECK(max_seqlen_q >= 0 && max_seqlen_k >= 0, "varlen_attention: max_seqlen_q and max_seqlen_k must be >= 0, "
              "got ", max_seqlen_q, " and ", max_seqlen_k);
  TORCH_CHECK(padded_q >= 0 && padded_k >= 0, "varlen_attention: padded_q and padded_k must be >= 0 (0: max_seqlen), "
              "got ", padded_q, " and ", padded_k);
  TORCH_CHECK(std::isfinite(scale), "varlen_attention: scale must be finite, got ", scale);
  VarlenIndex ix;
  ix.cu_q = check_index(cu_seqlens_q, q, {B + 1}, "cu_seqlens_q");
  ix.cu_k = check_index(cu_seqlens_k, q, {B + 1}, "cu_seqlens_k");
  if (starts.has_value() && starts->defined()) ix.starts = check_index(*starts, q, {B, 2}, "starts");
  if (!runs_cuda(q)) {
    check_offsets_values(ix.cu_q, q.size(0), max_seqlen_q, "cu_seqlens_q");
    check_offsets_values(ix.cu_k, k.size(0), max_seqlen_k, "cu_seqlens_k");
    if (ix.starts.defined())
      TORCH_CHECK(ix.starts.min().item<int32_t>() >= 0, "varlen_attention: starts must be >= 0");
  }
  ix.s = {.cu_seqlens_q = ix.cu_q.data_ptr<int32_t>(), .cu_seqlens_k = ix.cu_k.data_ptr<int32_t>(),
          .starts = ix.starts.defined() ? ix.starts.data_ptr<int32_t>() : nullptr, .B = B, .H = H, .D = D,
          .Nq = q.size(0), .Nk = k.size(0), .max_seqlen_q = max_seqlen_q, .max_seqlen_k = max_seqlen_k,
          .padded_q = padded_q ? padded_q : std::max<int64_t>(max_seqlen_q, 1),
          .padded_k = padded_k ? padded_k : std::max<int64_t>(max_seqlen_k, 1), .causal = causal, .scale = scale,
          .drop = make_dropout(p, seed, offset)};
  return ix;
}

struct VarlenAttentionFwd {
  VarlenIndex ix;
  at::Tensor q, k, v;
  at::Tensor out, lse;
  VarlenAttentionFwdParams params;
};

inline VarlenAttentionFwd varlen_attention_fwd_prepare(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                       const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k,
                                                       int64_t max_seqlen_q, int64_t max_seqlen_k, bool causal,
                                                       double scale, double p, int64_t seed, int64_t offset,
                                                       const c10::optional<at::Tensor>& starts, int64_t padded_q,
                                                       int64_t padded_k) {
  VarlenAttentionFwd op;
  op.ix = varlen_prepare(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale, p, seed,
                         offset, starts, padded_q, padded_k);
  op.q = q.contiguous();
  op.k = k.contiguous();
  op.v = v.contiguous();
  op.out = owned_rows_output(op.q);
  op.lse = owned_rows_output(op.q, {q.size(0), q.size(1)}, acc_type(q), -INFINITY);
  op.params = {.dtype = to_dtype(q.scalar_type()), .q = op.q.data_ptr(), .k = op.k.data_ptr(), .v = op.v.data_ptr(),
               .out = op.out.data_ptr(), .lse = op.lse.data_ptr(), .s = op.ix.s};
  return op;
}

struct VarlenAttentionBwd {
  VarlenIndex ix;
  at::Tensor dout, q, k, v, out, lse;
  at::Tensor dq, dk, dv;
  VarlenAttentionBwdParams params;
};

inline VarlenAttentionBwd varlen_attention_bwd_prepare(const at::Tensor& dout, const at::Tensor& q,
                                                       const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                                                       const at::Tensor& lse, const at::Tensor& cu_seqlens_q,
                                                       const at::Tensor& cu_seqlens_k, int64_t max_seqlen_q,
                                                       int64_t max_seqlen_k, bool causal, double scale, double p,
                                                       int64_t seed, int64_t offset,
                                                       const c10::optional<at::Tensor>& starts, int64_t padded_q,
                                                       int64_t padded_k) {
  VarlenAttentionBwd op;
  op.ix = varlen_prepare(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale, p, seed,
                         offset, starts, padded_q, padded_k);
  check_same(dout, q, "varlen_attention_bwd: dout", "q");
  check_same(out, q, "varlen_attention_bwd: out", "q");
  check_shape(dout, q.sizes(), "varlen_attention_bwd: dout");
  check_shape(out, q.sizes(), "varlen_attention_bwd: out");
  check_shape(lse, {q.size(0), q.size(1)}, "varlen_attention_bwd: lse");
  TORCH_CHECK(lse.scalar_type() == acc_type(q) && lse.device() == q.device(), "varlen_attention_bwd: lse must be ",
              acc_type(q), " on ", q.device(), ", got ", lse.scalar_type(), " on ", lse.device());
  op.dout = dout.contiguous();
  op.q = q.contiguous();
  op.k = k.contiguous();
  op.v = v.contiguous();
  op.out = out.contiguous();
  op.lse = lse.contiguous();
  op.dq = owned_rows_output(op.q);
  op.dk = owned_rows_output(op.k);
  op.dv = owned_rows_output(op.v);
  op.params = {.dtype = to_dtype(q.scalar_type()), .dout = op.dout.data_ptr(), .q = op.q.data_ptr(),
               .k = op.k.data_ptr(), .v = op.v.data_ptr(), .out = op.out.data_ptr(), .lse = op.lse.data_ptr(),
               .dq = op.dq.data_ptr(), .dk = op.dk.data_ptr(), .dv = op.dv.data_ptr(), .s = op.ix.s};
  return op;
}

// ---- CPU
std::tuple<at::Tensor, at::Tensor> varlen_attention_fwd_cpu(const at::Tensor& q, const at::Tensor& k,
                                                            const at::Tensor& v, const at::Tensor& cu_seqlens_q,
                                                            const at::Tensor& cu_seqlens_k, int64_t max_seqlen_q,
                                                            int64_t max_seqlen_k, bool causal, double scale, double p,
                                                            int64_t seed, int64_t offset,
                                                            const c10::optional<at::Tensor>& starts, int64_t padded_q,
                                                            int64_t padded_k) {
  auto op = varlen_attention_fwd_prepare(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                                         scale, p, seed, offset, starts, padded_q, padded_k);
  cpu::varlen_attention_fwd(op.params);
  return {op.out, op.lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> varlen_attention_bwd_cpu(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
    const at::Tensor& lse, const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k, int64_t max_seqlen_q,
    int64_t max_seqlen_k, bool causal, double scale, double p, int64_t seed, int64_t offset,
    const c10::optional<at::Tensor>& starts, int64_t padded_q, int64_t padded_k) {
  auto op = varlen_attention_bwd_prepare(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                         max_seqlen_k, causal, scale, p, seed, offset, starts, padded_q, padded_k);
  cpu::varlen_attention_bwd(op.params);
  return {op.dq, op.dk, op.dv};
}

// ---- CUDA (registered only in a CUDA build)
inline void check_cuda_limits(const VarlenProblem& s) {
  TORCH_CHECK(s.D <= kVarlenMaxHeadDim, "varlen_attention: head dim D must be at most ", kVarlenMaxHeadDim,
              " on CUDA, got ", s.D);
  TORCH_CHECK(s.B * s.H <= kMaxRows32, "varlen_attention: at most 2^31-1 (sentence, head) pairs on CUDA, got ",
              s.B * s.H);
}

std::tuple<at::Tensor, at::Tensor> varlen_attention_fwd_cuda(const at::Tensor& q, const at::Tensor& k,
                                                             const at::Tensor& v, const at::Tensor& cu_seqlens_q,
                                                             const at::Tensor& cu_seqlens_k, int64_t max_seqlen_q,
                                                             int64_t max_seqlen_k, bool causal, double scale, double p,
                                                             int64_t seed, int64_t offset,
                                                             const c10::optional<at::Tensor>& starts, int64_t padded_q,
                                                             int64_t padded_k) {
  const c10::DeviceGuard guard(q.device());
  auto op = varlen_attention_fwd_prepare(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                                         scale, p, seed, offset, starts, padded_q, padded_k);
  check_cuda_limits(op.params.s);
  FLS_CHECK_LAUNCH(cuda::varlen_attention_fwd(op.params, stream_of(q)));
  return {op.out, op.lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> varlen_attention_bwd_cuda(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
    const at::Tensor& lse, const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k, int64_t max_seqlen_q,
    int64_t max_seqlen_k, bool causal, double scale, double p, int64_t seed, int64_t offset,
    const c10::optional<at::Tensor>& starts, int64_t padded_q, int64_t padded_k) {
  const c10::DeviceGuard guard(q.device());
  auto op = varlen_attention_bwd_prepare(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                         max_seqlen_k, causal, scale, p, seed, offset, starts, padded_q, padded_k);
  check_cuda_limits(op.params.s);
  auto ws = workspace(cuda::varlen_attention_bwd_workspace(op.params.s), q);
  FLS_CHECK_LAUNCH(cuda::varlen_attention_bwd(op.params, ws.data_ptr<float>(), stream_of(q)));
  return {op.dq, op.dk, op.dv};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(fairseq_lightseq, m) {
  m.def(
      "varlen_attention_fwd(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, int max_seqlen_q, "
      "int max_seqlen_k, bool causal, float scale, float p, int seed, int offset, Tensor? starts=None, "
      "int padded_q=0, int padded_k=0) -> (Tensor out, Tensor lse)");
  m.def(
      "varlen_attention_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor cu_seqlens_q, "
      "Tensor cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, bool causal, float scale, float p, int seed, "
      "int offset, Tensor? starts=None, int padded_q=0, int padded_k=0) -> (Tensor dq, Tensor dk, Tensor dv)");
}

TORCH_LIBRARY_IMPL(fairseq_lightseq, CPU, m) {
  m.impl("varlen_attention_fwd", FLS_CPU_IMPL(varlen_attention_fwd));
  m.impl("varlen_attention_bwd", FLS_CPU_IMPL(varlen_attention_bwd));
}

TORCH_LIBRARY_IMPL(fairseq_lightseq, CUDA, m) {
  if (!kWithCuda) return;
  m.impl("varlen_attention_fwd", &varlen_attention_fwd_cuda);
  m.impl("varlen_attention_bwd", &varlen_attention_bwd_cuda);
}

}  // namespace fls
