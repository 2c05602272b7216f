// The sublayer blocks' forward and backward sequences (fairseq_lightseq/ops/blocks/) as ops of their own:
// attention_block_fwd/_bwd (explicit attention: bmm -> fused softmax + dropout -> bmm) and
// ffn_block_fwd/_bwd. Why in C++: each block runs ~15 tensor calls per direction, and from Python each
// costs a Python binding (a custom op's boxed call ~5 us, a view or GEMM ~1-3 us) before any work; the
// host path decides a step's speed on a GPU. Here the GEMMs and views are ATen calls and the fused ops are
// reached through the dispatcher's typed handles (no boxing), so the blocks are device-agnostic
// (CompositeExplicitAutograd: whatever device the fused ops have kernels for) and the CUDA sources stay
// plain CUDA. The autograd nodes are C++ too (attention_block, ffn_block below: torch::autograd::Function),
// so a training step calls one op per sublayer from Python and its backward never enters Python; only the
// SDPA attention path keeps a Python Function (ops/blocks/attention.py).
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <string>
#include <tuple>

#include "device.h"
#include "utils.h"

namespace fls {
namespace {

using at::Tensor;
using Tensor3 = std::tuple<Tensor, Tensor, Tensor>;
using Tensor2 = std::tuple<Tensor, Tensor>;

// A typed handle of one of the library's ops, looked up once per call site (the macro's static).
#define FLS_OP(var, name, Sig) \
  static const auto var = c10::Dispatcher::singleton().findSchemaOrThrow("fairseq_lightseq::" name, "").typed<Sig>()

Tensor3 ln_fwd(const Tensor& x, const Tensor& w, const Tensor& b, double eps) {
  FLS_OP(h, "layer_norm_fwd", Tensor3(const Tensor&, const Tensor&, const Tensor&, double));
  return h.call(x, w, b, eps);
}
Tensor3 ln_bwd(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd) {
  FLS_OP(h, "layer_norm_bwd", Tensor3(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&));
  return h.call(dy, x, w, mean, rstd);
}
// The token-wise dropout ops: over the block's own flat index (rows undefined: std::nullopt), or with the
// row map of packed rows (rows[r]: the padded row whose mask packed row r draws; ops/dropout_stream.py).
Tensor bdr_fwd(const Tensor& x, const Tensor& bias, const Tensor& res, double p, int64_t seed, int64_t off,
               const std::optional<Tensor>& rows) {
  FLS_OP(h, "bias_dropout_residual_fwd",
         Tensor(const Tensor&, const Tensor&, const Tensor&, double, int64_t, int64_t, const std::optional<Tensor>&));
  return h.call(x, bias, res, p, seed, off, rows);
}
Tensor2 bdr_bwd(const Tensor& dy, double p, int64_t seed, int64_t off, const std::optional<Tensor>& rows) {
  FLS_OP(h, "bias_dropout_residual_bwd",
         Tensor2(const Tensor&, double, int64_t, int64_t, const std::optional<Tensor>&));
  return h.call(dy, p, seed, off, rows);
}
Tensor bad_fwd(const Tensor& x, const Tensor& bias, double p, c10::string_view act, int64_t seed, int64_t off,
               const std::optional<Tensor>& rows) {
  FLS_OP(h, "bias_act_dropout_fwd",
         Tensor(const Tensor&, const Tensor&, double, c10::string_view, int64_t, int64_t,
                const std::optional<Tensor>&));
  return h.call(x, bias, p, act, seed, off, rows);
}
Tensor2 bad_bwd(const Tensor& dy, const Tensor& x, const Tensor& bias, double p, c10::string_view act, int64_t seed,
                int64_t off, const std::optional<Tensor>& rows) {
  FLS_OP(h, "bias_act_dropout_bwd",
         Tensor2(const Tensor&, const Tensor&, const Tensor&, double, c10::string_view, int64_t, int64_t,
                 const std::optional<Tensor>&));
  return h.call(dy, x, bias, p, act, seed, off, rows);
}
Tensor2 softmax_fwd(const Tensor& scores, const std::optional<Tensor>& kpm, bool causal, double scale, double p,
                    int64_t seed, int64_t off) {
  FLS_OP(h, "attention_softmax_fwd",
         Tensor2(const Tensor&, const std::optional<Tensor>&, bool, double, double, int64_t, int64_t,
                 c10::IntArrayRef));
  return h.call(scores, kpm, causal, scale, p, seed, off, {});  // the default coordinates: a whole problem
}
Tensor softmax_bwd(const Tensor& dout, const Tensor& y, double scale, double p, int64_t seed, int64_t off) {
  FLS_OP(h, "attention_softmax_bwd",
         Tensor(const Tensor&, const Tensor&, double, double, int64_t, int64_t, c10::IntArrayRef));
  return h.call(dout, y, scale, p, seed, off, {});
}
// The dropped probabilities again from the softmax output y (the forward's mask, default coordinates).
Tensor dropout_again(const Tensor& y, double p, int64_t seed, int64_t off) {
  FLS_OP(h, "attention_dropout", Tensor(const Tensor&, double, int64_t, int64_t, c10::IntArrayRef));
  return h.call(y, p, seed, off, {});
}
Tensor3 qkv_split(const Tensor& qkv, const Tensor& bias, int64_t heads) {
  FLS_OP(h, "qkv_bias_split", Tensor3(const Tensor&, const Tensor&, int64_t));
  return h.call(qkv, bias, heads);
}
Tensor2 qkv_split_bwd(const Tensor& dq, const Tensor& dk, const Tensor& dv, int64_t heads) {
  FLS_OP(h, "qkv_bias_split_bwd", Tensor2(const Tensor&, const Tensor&, const Tensor&, int64_t));
  return h.call(dq, dk, dv, heads);
}
Tensor merge(const Tensor& x, int64_t heads) {
  FLS_OP(h, "merge_heads", Tensor(const Tensor&, int64_t));
  return h.call(x, heads);
}

// [T, B, E] (unit last stride) -> contiguous [B*H, T, hd].
Tensor to_heads(const Tensor& t, int64_t H) {
  return t.reshape({t.size(0), t.size(1) * H, t.size(2) / H}).transpose(0, 1).contiguous();
}

// [B*H, T, hd] -> [T*B, E] (a copy), the layout of the GEMM that made the heads.
Tensor from_heads(const Tensor& t, int64_t H) {
  return t.transpose(0, 1).reshape({t.size(1) * t.size(0) / H, H * t.size(2)});
}

// The norm at the block's start: h = LN(x) for pre-LN (mean, rstd set), else x.
Tensor norm_start(const Tensor& x, const Tensor& w, const Tensor& b, bool pre_ln, double eps, Tensor& mean,
                  Tensor& rstd) {
  if (!pre_ln) return x;
  Tensor h;
  std::tie(h, mean, rstd) = ln_fwd(x, w, b, eps);
  return h;
}

// The residual end: s = x + dropout(out + bias); y = s (pre-LN) or LN(s) (post-LN: s kept for backward,
// mean/rstd replaced by its statistics). Returns y; `saved_s` is s for post-LN, undefined for pre-LN.
// rows: the dropout's row map over packed rows (std::nullopt: the flat index).
Tensor norm_end(const Tensor& out, const Tensor& bias, const Tensor& x, double p, int64_t seed, int64_t off,
                const Tensor& w, const Tensor& b, bool pre_ln, double eps, Tensor& saved_s, Tensor& mean,
                Tensor& rstd, const std::optional<Tensor>& rows = std::nullopt) {
  Tensor s = bdr_fwd(out, bias, x, p, seed, off, rows);
  if (pre_ln) return s;
  Tensor y;
  std::tie(y, mean, rstd) = ln_fwd(s, w, b, eps);
  saved_s = s;
  return y;
}

// Backward through the post-LN norm (dy -> ds, the norm's grads) or, for pre-LN, ds = dy and the
// recomputed h = LN(x). Returns h.
Tensor norm_bwd_start(const Tensor& dy, const Tensor& x, const Tensor& s, const Tensor& w, const Tensor& b,
                      const Tensor& mean, const Tensor& rstd, bool pre_ln, double eps, Tensor& ds, Tensor& dw,
                      Tensor& db) {
  if (pre_ln) {
    ds = dy;
    return std::get<0>(ln_fwd(x, w, b, eps));
  }
  std::tie(ds, dw, db) = ln_bwd(dy, s, w, mean, rstd);
  return x;
}

// dx = ds + dh taken back through the pre-LN norm (which sets dw, db) or as is (post-LN).
Tensor norm_bwd_end(const Tensor& ds, const Tensor& dh, const Tensor& x, const Tensor& w, const Tensor& mean,
                    const Tensor& rstd, bool pre_ln, Tensor& dw, Tensor& db) {
  if (!pre_ln) return ds + dh;
  Tensor dhx;
  std::tie(dhx, dw, db) = ln_bwd(dh, x, w, mean, rstd);
  return ds + dhx;
}

// The scores' gradient [B*H, Tq, Tk] from the probabilities' gradient dprobs [B*H, Tq, Tk] (y: the
// softmax output [B, H, Tq, Tk], dropped: the dropped probabilities as [B*H, Tq, Tk]). With dropout (fac = the mask's
// multipliers, `dropped` = fac * y drawn again from y), g = fac * dprobs and
//   dscores = scale * y * (g - sum_k g_k y_k) = scale * (dropped * dprobs - y * sum_k dropped_k dprobs_k),
// so the mask need not be drawn a second time: on CPU (where the fused kernel's redraw costs ~4 ns an element:
// 94 us vs 16 us for [16, 2, 24, 24]) four ATen calls, in float/double; half types keep the kernel, which
// accumulates in float, and so does CUDA, where one launch costs less host time than four.
Tensor softmax_dropout_bwd(const Tensor& dprobs, const Tensor& dropped, const Tensor& y, bool has_dropout,
                           double scale, double p, int64_t seed, int64_t off) {
  if (has_dropout && !runs_cuda(y) && (y.scalar_type() == at::kFloat || y.scalar_type() == at::kDouble)) {
    const Tensor g = dprobs * dropped;
    return at::addcmul(g, y.view(g.sizes()), g.sum(-1, true), -1).mul_(scale);
  }
  return softmax_bwd(dprobs.view(y.sizes()), y, scale, p, seed, off).view(dprobs.sizes());
}

// q, k, v as [B*H, T, hd] from the block's normalised input h2 [Tq*B, E] (self-attention: one [3E, E] GEMM
// and the fused bias add + head split) or from h2 and the memory [Tk, B, Ek] (encoder-decoder attention).
// Backward either gets them saved or projects them again (the block's `recompute` flag).
Tensor3 project_qkv(const Tensor& h2, const std::optional<Tensor>& memory, const Tensor& wq, const Tensor& bq,
                    const Tensor& wk, const Tensor& bk, const Tensor& wv, const Tensor& bv, int64_t Tq, int64_t B,
                    int64_t H) {
  const int64_t E = wq.size(0);
  if (!memory.has_value()) {
    const Tensor qkv = at::mm(h2, at::cat({wq, wk, wv}).t()).view({Tq, B, 3 * E});
    return qkv_split(qkv, at::cat({bq, bk, bv}), H);
  }
  const Tensor& m = *memory;
  const int64_t Tk = m.size(0);
  Tensor q = to_heads(at::addmm(bq, h2, wq.t()).view({Tq, B, E}), H);
  const Tensor kv = at::addmm(at::cat({bk, bv}), m.reshape({Tk * B, -1}), at::cat({wk, wv}).t()).view({Tk, B, 2 * E});
  return {q, to_heads(kv.slice(2, 0, E), H), to_heads(kv.slice(2, E, 2 * E), H)};
}

// Backward of project_qkv: dq [B*H, Tq, hd], dk, dv [B*H, Tk, hd] -> (dh2 [Tq*B, E], dmemory (undefined for
// self-attention), dwq, dbq, dwk, dbk, dwv, dbv).
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> project_qkv_bwd(
    const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& h2, const std::optional<Tensor>& memory,
    const Tensor& wq, const Tensor& wk, const Tensor& wv, int64_t H) {
  const int64_t E = wq.size(0);
  if (!memory.has_value()) {
    auto [dqkv, dbqkv] = qkv_split_bwd(dq, dk, dv, H);
    dqkv = dqkv.view({-1, 3 * E});
    const auto dw = at::mm(dqkv.t(), h2).split(E);
    const auto db = dbqkv.split(E);
    return {at::mm(dqkv, at::cat({wq, wk, wv})), Tensor(), dw[0], db[0], dw[1], db[1], dw[2], db[2]};
  }
  const Tensor& m = *memory;
  const int64_t Tk = m.size(0);
  const Tensor dq2 = from_heads(dq, H);
  const Tensor dkv = at::cat({from_heads(dk, H), from_heads(dv, H)}, 1);  // [Tk*B, 2E]
  const auto dw = at::mm(dkv.t(), m.reshape({Tk * m.size(1), -1})).split(E);
  const auto db = dkv.sum(0).split(E);
  return {at::mm(dq2, wq), at::mm(dkv, at::cat({wk, wv})).view(m.sizes()), at::mm(dq2.t(), h2), dq2.sum(0),
          dw[0], db[0], dw[1], db[1]};
}

// See ops/blocks/attention.py (AttentionBlockFunction) for the arguments. Returns (y, s, mean, rstd, probs,
// q, k, v, merged): s is undefined for pre-LN; probs [B, H, Tq, Tk] the softmax output; q [B*H, Tq, hd],
// k, v [B*H, Tk, hd]; merged [Tq*B, E] the output GEMM's input. The dropped probabilities are not
// returned: backward draws them again from probs (attention_dropout), so one [B, H, Tq, Tk] tensor a layer
// is kept, not two.
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> attention_block_fwd(
    const Tensor& x, const std::optional<Tensor>& memory, const std::optional<Tensor>& key_padding_mask,
    const Tensor& ln_weight, const Tensor& ln_bias, const Tensor& wq, const Tensor& bq, const Tensor& wk,
    const Tensor& bk, const Tensor& wv, const Tensor& bv, const Tensor& wo, const Tensor& bo, int64_t num_heads,
    double scale, bool causal, bool normalize_before, double eps, double attn_p, int64_t attn_seed,
    int64_t attn_offset, double p, int64_t seed, int64_t offset) {
  // These ops run inside an autograd Function: the ATen calls below skip the autograd layers.
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  TORCH_CHECK(x.dim() == 3, "attention_block_fwd: x must be [T, B, E], got ", x.sizes());
  const int64_t Tq = x.size(0), B = x.size(1), E = x.size(2), H = num_heads;
  TORCH_CHECK(H > 0 && E % H == 0, "attention_block_fwd: num_heads = ", H, " must divide E = ", E);
  Tensor mean, rstd, s, q, k, v;
  const Tensor h2 = norm_start(x, ln_weight, ln_bias, normalize_before, eps, mean, rstd).reshape({Tq * B, E});
  std::tie(q, k, v) = project_qkv(h2, memory, wq, bq, wk, bk, wv, bv, Tq, B, H);
  const int64_t Tk = k.size(1);
  Tensor y, dropped;
  std::tie(y, dropped) = softmax_fwd(at::bmm(q, k.transpose(1, 2)).view({B, H, Tq, Tk}), key_padding_mask, causal,
                                     scale, attn_p, attn_seed, attn_offset);
  const Tensor& probs = dropped.numel() ? dropped : y;
  const Tensor merged = merge(at::bmm(probs.view({B * H, Tq, Tk}), v), H).view({Tq * B, E});
  const Tensor out = at::mm(merged, wo.t()).view({Tq, B, E});
  Tensor out_y = norm_end(out, bo, x, p, seed, offset, ln_weight, ln_bias, normalize_before, eps, s, mean, rstd);
  return {out_y, s, mean, rstd, y, q, k, v, merged};
}

// Returns (dx, dmemory (undefined for self-attention), dln_weight, dln_bias, dwq, dbq, dwk, dbk, dwv, dbv,
// dwo, dbo). q, k, v and merged are the forward's, or undefined (recompute): then q, k, v are projected
// again from the block input (project_qkv) and merged rebuilt from the probabilities and v. The dropped
// probabilities are drawn again from y (attention_dropout: the forward's mask).
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>
attention_block_bwd(const Tensor& dy, const Tensor& x, const std::optional<Tensor>& memory, const Tensor& ln_weight,
                    const Tensor& ln_bias, const Tensor& wq, const Tensor& bq, const Tensor& wk, const Tensor& bk,
                    const Tensor& wv, const Tensor& bv, const Tensor& wo, const std::optional<Tensor>& s,
                    const Tensor& mean, const Tensor& rstd, const Tensor& y, const std::optional<Tensor>& saved_q,
                    const std::optional<Tensor>& saved_k, const std::optional<Tensor>& saved_v,
                    const std::optional<Tensor>& saved_merged, int64_t num_heads,
                    double scale, bool normalize_before, double eps, double attn_p, int64_t attn_seed,
                    int64_t attn_offset, double p, int64_t seed, int64_t offset) {
  // These ops run inside an autograd Function: the ATen calls below skip the autograd layers.
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  const int64_t Tq = x.size(0), B = x.size(1), E = x.size(2), H = num_heads, hd = E / H;
  Tensor ds, dln_w, dln_b, dout, dbo;
  const Tensor h = norm_bwd_start(dy, x, s.has_value() ? *s : Tensor(), ln_weight, ln_bias, mean, rstd,
                                  normalize_before, eps, ds, dln_w, dln_b);
  const Tensor h2 = h.reshape({Tq * B, E});
  Tensor q, k, v;
  if (saved_q.has_value() && saved_q->defined()) {
    q = *saved_q, k = *saved_k, v = *saved_v;
  } else {
    std::tie(q, k, v) = project_qkv(h2, memory, wq, bq, wk, bk, wv, bv, Tq, B, H);
  }
  std::tie(dout, dbo) = bdr_bwd(ds, p, seed, offset, std::nullopt);
  const Tensor dout2 = dout.view({Tq * B, E});
  // [Tq, B, H, hd] seen as [B*H, Tq, hd]
  const Tensor dctx = at::mm(dout2, wo).view({Tq, B, H, hd}).permute({1, 2, 0, 3}).reshape({B * H, Tq, hd});
  const bool has_dropout = make_dropout(attn_p, attn_seed, attn_offset).threshold != 0;
  const Tensor probs = (has_dropout ? dropout_again(y, attn_p, attn_seed, attn_offset) : y).view({B * H, Tq, -1});
  const Tensor merged = saved_merged.has_value() && saved_merged->defined()
                            ? *saved_merged
                            : merge(at::bmm(probs, v), H).view({Tq * B, E});
  const Tensor dwo = at::mm(dout2.t(), merged);
  const Tensor dv = at::bmm(probs.transpose(1, 2), dctx);
  const Tensor dscores = softmax_dropout_bwd(at::bmm(dctx, v.transpose(1, 2)), probs, y, has_dropout, scale, attn_p,
                                             attn_seed, attn_offset);
  const Tensor dq = at::bmm(dscores, k), dk = at::bmm(dscores.transpose(1, 2), q);
  Tensor dh, dmemory, dwq, dbq, dwk, dbk, dwv, dbv;
  std::tie(dh, dmemory, dwq, dbq, dwk, dbk, dwv, dbv) = project_qkv_bwd(dq, dk, dv, h2, memory, wq, wk, wv, H);
  const Tensor dx =
      norm_bwd_end(ds, dh.view({Tq, B, E}), x, ln_weight, mean, rstd, normalize_before, dln_w, dln_b);
  return {dx, dmemory, dln_w, dln_b, dwq, dbq, dwk, dbk, dwv, dbv, dwo, dbo};
}

// See ops/blocks/feed_forward.py. x: [..., E] (padded [T, B, E] or packed [N, E]); rows: the dropouts' row
// map over packed rows, or std::nullopt. Returns (y, pre (fc1's output [M, F], the activation's input), s
// (undefined for pre-LN), mean, rstd).
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> ffn_block_fwd(
    const Tensor& x, const Tensor& ln_weight, const Tensor& ln_bias, const Tensor& w1, const Tensor& b1,
    const Tensor& w2, const Tensor& b2, c10::string_view act, bool normalize_before, double eps, double act_p,
    int64_t act_seed, int64_t act_offset, double p, int64_t seed, int64_t offset, const std::optional<Tensor>& rows) {
  // These ops run inside an autograd Function: the ATen calls below skip the autograd layers.
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  TORCH_CHECK(x.dim() >= 2, "ffn_block_fwd: x must be [T, B, E] or [N, E], got ", x.sizes());
  const int64_t E = x.size(-1), M = x.numel() / std::max<int64_t>(E, 1);
  Tensor mean, rstd, s;
  const Tensor h = norm_start(x, ln_weight, ln_bias, normalize_before, eps, mean, rstd);
  const Tensor pre = at::mm(h.reshape({M, E}), w1.t());  // [M, F]
  const Tensor out = at::mm(bad_fwd(pre, b1, act_p, act, act_seed, act_offset, rows), w2.t()).view(x.sizes());
  Tensor y = norm_end(out, b2, x, p, seed, offset, ln_weight, ln_bias, normalize_before, eps, s, mean, rstd, rows);
  return {y, pre, s, mean, rstd};
}

// Returns (dx, dln_weight, dln_bias, dw1, db1, dw2, db2). The activation output is recomputed from pre.
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> ffn_block_bwd(
    const Tensor& dy, const Tensor& x, const Tensor& ln_weight, const Tensor& ln_bias, const Tensor& w1,
    const Tensor& b1, const Tensor& w2, const Tensor& pre, const std::optional<Tensor>& s, const Tensor& mean,
    const Tensor& rstd, c10::string_view act, bool normalize_before, double eps, double act_p, int64_t act_seed,
    int64_t act_offset, double p, int64_t seed, int64_t offset, const std::optional<Tensor>& rows) {
  // These ops run inside an autograd Function: the ATen calls below skip the autograd layers.
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  const int64_t E = x.size(-1), M = pre.size(0);
  Tensor ds, dln_w, dln_b, dout, db2, dpre, db1;
  const Tensor h = norm_bwd_start(dy, x, s.has_value() ? *s : Tensor(), ln_weight, ln_bias, mean, rstd,
                                  normalize_before, eps, ds, dln_w, dln_b);
  std::tie(dout, db2) = bdr_bwd(ds, p, seed, offset, rows);
  const Tensor dout2 = dout.view({M, E});
  const Tensor dw2 = at::mm(dout2.t(), bad_fwd(pre, b1, act_p, act, act_seed, act_offset, rows));
  std::tie(dpre, db1) = bad_bwd(at::mm(dout2, w2), pre, b1, act_p, act, act_seed, act_offset, rows);
  const Tensor dw1 = at::mm(dpre.t(), h.reshape({M, E}));
  const Tensor dx =
      norm_bwd_end(ds, at::mm(dpre, w1).view(x.sizes()), x, ln_weight, mean, rstd, normalize_before, dln_w, dln_b);
  return {dx, dln_w, dln_b, dw1, db1, dw2, db2};
}

// ---- The attention sublayer over packed rows (--ls-packed) ------------------------------------------------
// See ops/blocks/packed_attention.py. x: [Nq, E] packed rows; memory: [Nk, Ek] packed encoder rows (None: self-
// attention); the attention is varlen_attention_fwd/_bwd over (cu_q, cu_k, max_q, max_k, causal, starts,
// padded_q, padded_k), its dropout the padded problem's; rows: the residual dropout's row map.

Tensor2 varlen_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_q, const Tensor& cu_k,
                   int64_t max_q, int64_t max_k, bool causal, double scale, double p, int64_t seed, int64_t off,
                   const std::optional<Tensor>& starts, int64_t padded_q, int64_t padded_k) {
  FLS_OP(h, "varlen_attention_fwd",
         Tensor2(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t, int64_t, bool,
                 double, double, int64_t, int64_t, const std::optional<Tensor>&, int64_t, int64_t));
  return h.call(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, p, seed, off, starts, padded_q, padded_k);
}
Tensor3 varlen_bwd(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                   const Tensor& lse, const Tensor& cu_q, const Tensor& cu_k, int64_t max_q, int64_t max_k, bool causal,
                   double scale, double p, int64_t seed, int64_t off, const std::optional<Tensor>& starts,
                   int64_t padded_q, int64_t padded_k) {
  FLS_OP(h, "varlen_attention_bwd",
         Tensor3(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                 const Tensor&, const Tensor&, int64_t, int64_t, bool, double, double, int64_t, int64_t,
                 const std::optional<Tensor>&, int64_t, int64_t));
  return h.call(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal, scale, p, seed, off, starts, padded_q,
                padded_k);
}

// q [Nq, H, hd] from the normalised rows h2 [Nq, E]; k, v [Nk, H, hd] from memory [Nk, Ek] (encoder-decoder
// attention) or from h2 (self-attention). One GEMM per projection: each output is contiguous as the
// attention takes it, with no copy.
Tensor3 project_packed(const Tensor& h2, const std::optional<Tensor>& memory, const Tensor& wq, const Tensor& bq,
                       const Tensor& wk, const Tensor& bk, const Tensor& wv, const Tensor& bv, int64_t H) {
  const int64_t E = wq.size(0);
  const Tensor& src = memory.has_value() ? *memory : h2;
  const int64_t Nq = h2.size(0), Nk = src.size(0);
  return {at::addmm(bq, h2, wq.t()).view({Nq, H, E / H}), at::addmm(bk, src, wk.t()).view({Nk, H, E / H}),
          at::addmm(bv, src, wv.t()).view({Nk, H, E / H})};
}

// Returns (y [Nq, E], s (undefined for pre-LN), mean, rstd, out [Nq, H, hd] (the attention's output), lse
// [Nq, H] (its log-sum-exp), q, k, v).
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> varlen_attention_block_fwd(
    const Tensor& x, const std::optional<Tensor>& memory, const Tensor& cu_q, const Tensor& cu_k,
    const std::optional<Tensor>& starts, const std::optional<Tensor>& rows, const Tensor& ln_weight,
    const Tensor& ln_bias, const Tensor& wq, const Tensor& bq, const Tensor& wk, const Tensor& bk, const Tensor& wv,
    const Tensor& bv, const Tensor& wo, const Tensor& bo, int64_t num_heads, int64_t max_q, int64_t max_k,
    int64_t padded_q, int64_t padded_k, double scale, bool causal, bool normalize_before, double eps, double attn_p,
    int64_t attn_seed, int64_t attn_offset, double p, int64_t seed, int64_t offset) {
  // These ops run inside an autograd Function: the ATen calls below skip the autograd layers.
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  TORCH_CHECK(x.dim() == 2, "varlen_attention_block_fwd: x must be packed rows [N, E], got ", x.sizes());
  TORCH_CHECK(!memory.has_value() || memory->dim() == 2,
              "varlen_attention_block_fwd: memory must be packed rows [N, E], got ", memory->sizes());
  const int64_t Nq = x.size(0), E = x.size(1), H = num_heads;
  TORCH_CHECK(H > 0 && E % H == 0, "varlen_attention_block_fwd: num_heads = ", H, " must divide E = ", E);
  Tensor mean, rstd, s, q, k, v, out, lse;
  const Tensor h2 = norm_start(x, ln_weight, ln_bias, normalize_before, eps, mean, rstd);
  std::tie(q, k, v) = project_packed(h2, memory, wq, bq, wk, bk, wv, bv, H);
  std::tie(out, lse) = varlen_fwd(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, attn_p, attn_seed, attn_offset,
                                  starts, padded_q, padded_k);
  const Tensor o = at::mm(out.view({Nq, E}), wo.t());
  Tensor y = norm_end(o, bo, x, p, seed, offset, ln_weight, ln_bias, normalize_before, eps, s, mean, rstd, rows);
  return {y, s, mean, rstd, out, lse, q, k, v};
}

// Returns (dx, dmemory (undefined for self-attention), dln_weight, dln_bias, dwq, dbq, dwk, dbk, dwv, dbv, dwo,
// dbo). out, lse, q, k, v are the forward's, or undefined (recompute): then q, k, v are projected again from
// the block input and the attention's forward runs again for out and lse (the same dropout mask).
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>
varlen_attention_block_bwd(const Tensor& dy, const Tensor& x, const std::optional<Tensor>& memory, const Tensor& cu_q,
                           const Tensor& cu_k, const std::optional<Tensor>& starts, const std::optional<Tensor>& rows,
                           const Tensor& ln_weight, const Tensor& ln_bias, const Tensor& wq, const Tensor& bq,
                           const Tensor& wk, const Tensor& bk, const Tensor& wv, const Tensor& bv, const Tensor& wo,
                           const std::optional<Tensor>& s, const Tensor& mean, const Tensor& rstd,
                           const std::optional<Tensor>& saved_out, const std::optional<Tensor>& saved_lse,
                           const std::optional<Tensor>& saved_q, const std::optional<Tensor>& saved_k,
                           const std::optional<Tensor>& saved_v, int64_t num_heads, int64_t max_q, int64_t max_k,
                           int64_t padded_q, int64_t padded_k, double scale, bool causal, bool normalize_before,
                           double eps, double attn_p, int64_t attn_seed, int64_t attn_offset, double p, int64_t seed,
                           int64_t offset) {
  // These ops run inside an autograd Function: the ATen calls below skip the autograd layers.
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  const int64_t Nq = x.size(0), E = x.size(1), H = num_heads;
  Tensor ds, dln_w, dln_b, dout, dbo;
  const Tensor h2 = norm_bwd_start(dy, x, s.has_value() ? *s : Tensor(), ln_weight, ln_bias, mean, rstd,
                                   normalize_before, eps, ds, dln_w, dln_b);
  Tensor q, k, v, out, lse;
  if (saved_q.has_value() && saved_q->defined()) {
    q = *saved_q, k = *saved_k, v = *saved_v, out = *saved_out, lse = *saved_lse;
  } else {
    std::tie(q, k, v) = project_packed(h2, memory, wq, bq, wk, bk, wv, bv, H);
    std::tie(out, lse) = varlen_fwd(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, attn_p, attn_seed, attn_offset,
                                    starts, padded_q, padded_k);
  }
  std::tie(dout, dbo) = bdr_bwd(ds, p, seed, offset, rows);
  const Tensor dwo = at::mm(dout.t(), out.view({Nq, E}));
  const Tensor dctx = at::mm(dout, wo).view(q.sizes());
  auto [dq, dk, dv] = varlen_bwd(dctx, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal, scale, attn_p, attn_seed,
                                 attn_offset, starts, padded_q, padded_k);
  const Tensor dq2 = dq.view({Nq, E}), dk2 = dk.view({dk.size(0), E}), dv2 = dv.view({dv.size(0), E});
  const Tensor& src = memory.has_value() ? *memory : h2;
  Tensor dh = at::mm(dq2, wq), dmemory;
  if (memory.has_value()) {
    dmemory = at::mm(dk2, wk).addmm_(dv2, wv);
  } else {
    dh.addmm_(dk2, wk).addmm_(dv2, wv);
  }
  const Tensor dx = norm_bwd_end(ds, dh, x, ln_weight, mean, rstd, normalize_before, dln_w, dln_b);
  return {dx, dmemory, dln_w, dln_b, at::mm(dq2.t(), h2), dq2.sum(0), at::mm(dk2.t(), src), dk2.sum(0),
          at::mm(dv2.t(), src), dv2.sum(0), dwo, dbo};
}

// ---- The autograd nodes ------------------------------------------------------------------------------------
// One node per sublayer: forward runs *_block_fwd and saves what *_block_bwd takes; the scalar arguments
// live in saved_data. backward returns one gradient per forward argument (undefined for the mask and the
// scalars). Both call the *_block_fwd/_bwd ops through the dispatcher (one hop each), so that they stay
// whole ops to whatever intercepts calls below autograd (a TorchDispatchMode, the profiler).

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using SavedData = decltype(AutogradContext::saved_data);

// One dropout draw as a node keeps it: prefix + "p", "seed", "offset" ("": the residual dropout; "attn_",
// "act_": the sublayer's own).
void save_draw(SavedData& d, const std::string& prefix, double p, int64_t seed, int64_t offset) {
  d[prefix + "p"] = p, d[prefix + "seed"] = seed, d[prefix + "offset"] = offset;
}

// A saved tensor back as an optional argument (undefined: std::nullopt).
std::optional<Tensor> opt(const Tensor& t) { return t.defined() ? std::optional<Tensor>(t) : std::nullopt; }

// The saved scalars read back by name in backward.
struct Scalars {
  const SavedData& d;
  int64_t i(const char* key) const { return d.at(key).toInt(); }
  double f(const char* key) const { return d.at(key).toDouble(); }
  bool b(const char* key) const { return d.at(key).toBool(); }
  std::string str(const char* key) const { return d.at(key).toStringRef(); }
};

struct AttentionBlockNode : public torch::autograd::Function<AttentionBlockNode> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const std::optional<Tensor>& memory,
                        const std::optional<Tensor>& key_padding_mask, const Tensor& ln_weight, const Tensor& ln_bias,
                        const Tensor& wq, const Tensor& bq, const Tensor& wk, const Tensor& bk, const Tensor& wv,
                        const Tensor& bv, const Tensor& wo, const Tensor& bo, int64_t num_heads, double scale,
                        bool causal, bool normalize_before, double eps, double attn_p, int64_t attn_seed,
                        int64_t attn_offset, double p, int64_t seed, int64_t offset, bool recompute) {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    FLS_OP(fwd, "attention_block_fwd", decltype(attention_block_fwd));
    auto [y, s, mean, rstd, probs, q, k, v, merged] =
        fwd.call(x, memory, key_padding_mask, ln_weight, ln_bias, wq, bq, wk, bk, wv, bv, wo, bo, num_heads,
                            scale, causal, normalize_before, eps, attn_p, attn_seed, attn_offset, p, seed, offset);
    if (recompute) q = k = v = merged = Tensor();  // freed now; backward projects them again
    ctx->save_for_backward({x, memory.value_or(Tensor()), ln_weight, ln_bias, wq, bq, wk, bk, wv, bv, wo, s, mean,
                            rstd, probs, q, k, v, merged});
    auto& d = ctx->saved_data;
    d["num_heads"] = num_heads, d["scale"] = scale, d["normalize_before"] = normalize_before, d["eps"] = eps;
    save_draw(d, "attn_", attn_p, attn_seed, attn_offset);
    save_draw(d, "", p, seed, offset);
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list t = ctx->get_saved_variables();
    const Scalars d{ctx->saved_data};
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    FLS_OP(bwd, "attention_block_bwd", decltype(attention_block_bwd));
    auto [dx, dmemory, dln_w, dln_b, dwq, dbq, dwk, dbk, dwv, dbv, dwo, dbo] = bwd.call(
        grads[0].contiguous(), t[0], opt(t[1]), t[2], t[3], t[4], t[5], t[6], t[7], t[8], t[9], t[10], opt(t[11]),
        t[12], t[13], t[14], opt(t[15]), opt(t[16]), opt(t[17]), opt(t[18]), d.i("num_heads"), d.f("scale"),
        d.b("normalize_before"), d.f("eps"), d.f("attn_p"), d.i("attn_seed"), d.i("attn_offset"), d.f("p"),
        d.i("seed"), d.i("offset"));
    variable_list out = {dx, dmemory, Tensor(), dln_w, dln_b, dwq, dbq, dwk, dbk, dwv, dbv, dwo, dbo};
    out.resize(25);  // the 12 scalar arguments
    return out;
  }
};

struct FeedForwardBlockNode : public torch::autograd::Function<FeedForwardBlockNode> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const Tensor& ln_weight, const Tensor& ln_bias,
                        const Tensor& w1, const Tensor& b1, const Tensor& w2, const Tensor& b2, c10::string_view act,
                        bool normalize_before, double eps, double act_p, int64_t act_seed, int64_t act_offset,
                        double p, int64_t seed, int64_t offset, const std::optional<Tensor>& rows) {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    FLS_OP(fwd, "ffn_block_fwd", decltype(ffn_block_fwd));
    auto [y, pre, s, mean, rstd] = fwd.call(x, ln_weight, ln_bias, w1, b1, w2, b2, act, normalize_before, eps,
                                                 act_p, act_seed, act_offset, p, seed, offset, rows);
    ctx->save_for_backward({x, ln_weight, ln_bias, w1, b1, w2, pre, s, mean, rstd, rows.value_or(Tensor())});
    auto& d = ctx->saved_data;
    d["act"] = std::string(act), d["normalize_before"] = normalize_before, d["eps"] = eps;
    save_draw(d, "act_", act_p, act_seed, act_offset);
    save_draw(d, "", p, seed, offset);
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list t = ctx->get_saved_variables();
    const Scalars d{ctx->saved_data};
    const std::string act = d.str("act");
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    FLS_OP(bwd, "ffn_block_bwd", decltype(ffn_block_bwd));
    auto [dx, dln_w, dln_b, dw1, db1, dw2, db2] = bwd.call(
        grads[0].contiguous(), t[0], t[1], t[2], t[3], t[4], t[5], t[6], opt(t[7]), t[8], t[9], act,
        d.b("normalize_before"), d.f("eps"), d.f("act_p"), d.i("act_seed"), d.i("act_offset"), d.f("p"), d.i("seed"),
        d.i("offset"), opt(t[10]));
    variable_list out = {dx, dln_w, dln_b, dw1, db1, dw2, db2};
    out.resize(17);  // the 9 scalar arguments and the row map
    return out;
  }
};

// The packed attention sublayer. Saved: the block input, memory, the norm's statistics (post-LN: its input) and,
// without recompute, q, k, v, the attention output and its log-sum-exp; with recompute backward projects q, k,
// v again and reruns the attention's forward (nothing of the attention is kept: less than the padded block,
// which keeps its [B, H, Tq, Tk] probabilities).
struct VarlenAttentionBlockNode : public torch::autograd::Function<VarlenAttentionBlockNode> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const std::optional<Tensor>& memory, const Tensor& cu_q,
                        const Tensor& cu_k, const std::optional<Tensor>& starts, const std::optional<Tensor>& rows,
                        const Tensor& ln_weight, const Tensor& ln_bias, const Tensor& wq, const Tensor& bq,
                        const Tensor& wk, const Tensor& bk, const Tensor& wv, const Tensor& bv, const Tensor& wo,
                        const Tensor& bo, int64_t num_heads, int64_t max_q, int64_t max_k, int64_t padded_q,
                        int64_t padded_k, double scale, bool causal, bool normalize_before, double eps, double attn_p,
                        int64_t attn_seed, int64_t attn_offset, double p, int64_t seed, int64_t offset,
                        bool recompute) {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    FLS_OP(fwd, "varlen_attention_block_fwd", decltype(varlen_attention_block_fwd));
    auto [y, s, mean, rstd, out, lse, q, k, v] =
        fwd.call(x, memory, cu_q, cu_k, starts, rows, ln_weight, ln_bias, wq, bq, wk, bk, wv, bv, wo, bo, num_heads,
                 max_q, max_k, padded_q, padded_k, scale, causal, normalize_before, eps, attn_p, attn_seed,
                 attn_offset, p, seed, offset);
    if (recompute) out = lse = q = k = v = Tensor();  // freed now; backward computes them again
    ctx->save_for_backward({x, memory.value_or(Tensor()), cu_q, cu_k, starts.value_or(Tensor()),
                            rows.value_or(Tensor()), ln_weight, ln_bias, wq, bq, wk, bk, wv, bv, wo, s, mean, rstd,
                            out, lse, q, k, v});
    auto& d = ctx->saved_data;
    d["num_heads"] = num_heads, d["max_q"] = max_q, d["max_k"] = max_k, d["padded_q"] = padded_q;
    d["padded_k"] = padded_k, d["scale"] = scale, d["causal"] = causal, d["normalize_before"] = normalize_before;
    d["eps"] = eps;
    save_draw(d, "attn_", attn_p, attn_seed, attn_offset);
    save_draw(d, "", p, seed, offset);
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list t = ctx->get_saved_variables();
    const Scalars d{ctx->saved_data};
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    FLS_OP(bwd, "varlen_attention_block_bwd", decltype(varlen_attention_block_bwd));
    auto [dx, dmemory, dln_w, dln_b, dwq, dbq, dwk, dbk, dwv, dbv, dwo, dbo] = bwd.call(
        grads[0].contiguous(), t[0], opt(t[1]), t[2], t[3], opt(t[4]), opt(t[5]), t[6], t[7], t[8], t[9], t[10],
        t[11], t[12], t[13], t[14], opt(t[15]), t[16], t[17], opt(t[18]), opt(t[19]), opt(t[20]), opt(t[21]),
        opt(t[22]), d.i("num_heads"), d.i("max_q"), d.i("max_k"), d.i("padded_q"), d.i("padded_k"), d.f("scale"),
        d.b("causal"), d.b("normalize_before"), d.f("eps"), d.f("attn_p"), d.i("attn_seed"), d.i("attn_offset"),
        d.f("p"), d.i("seed"), d.i("offset"));
    variable_list out = {dx, dmemory, Tensor(), Tensor(), Tensor(), Tensor(), dln_w, dln_b, dwq, dbq, dwk, dbk, dwv,
                         dbv, dwo, dbo};
    out.resize(32);  // the 16 scalar arguments
    return out;
  }
};

// The SDPA attention (torch's fused scaled_dot_product_attention: CUDA's path) as a node of its own. SDPA
// runs on detached leaf copies of q, k, v in a small graph of its own, kept for backward (SDPA keeps q, k,
// v, its output and logsumexp, as it does anywhere); backward asks torch::autograd::grad for SDPA's own
// backward through it (whichever kernel SDPA picked). Also saved: the block input and the norm's
// statistics (post-LN: its input). The merged heads are rebuilt from SDPA's output. SDPA's dropout draws
// from torch's generator. With `recompute` and no attention dropout (SDPA then a deterministic function of
// q, k, v), backward projects q, k, v again and reruns SDPA's forward instead: ~4 [T, B, E] tensors fewer
// per attention for a QKV GEMM and an SDPA forward per attention per step. With dropout its mask comes
// from torch's generator, which a second forward would advance differently: the graph is kept.

// SDPA's boolean attend-mask [B, 1, Tq, Tk] (True = attend) and is_causal flag: the Python _sdpa_mask
// (ops/blocks/attention.py), which says why a row with no key attends to itself.
std::pair<std::optional<Tensor>, bool> sdpa_mask(const std::optional<Tensor>& key_padding_mask, bool causal,
                                                 int64_t Tq, int64_t Tk) {
  if (!key_padding_mask.has_value()) return {std::nullopt, causal && Tq > 1};
  const Tensor& kpm = *key_padding_mask;
  const Tensor keep = kpm.view({kpm.size(0), 1, 1, Tk}).to(at::kBool).logical_not();
  if (!causal) return {keep, false};
  const auto opts = keep.options();
  const Tensor mask = at::ones({Tq, Tk}, opts).tril(Tk - Tq).logical_and(keep);
  const Tensor diag = at::eye(Tq, Tk, opts);
  return {mask.logical_or(diag.logical_and(mask.any(-1, true).logical_not())), false};
}

// The forward of the SDPA block; record: run SDPA on leaf copies of q, k, v with grad mode on, and return
// them and its output (for backward) in o, qs, ks, vs. s, mean, rstd: as attention_block_fwd's.
Tensor sdpa_block_fwd(const Tensor& x, const std::optional<Tensor>& memory,
                      const std::optional<Tensor>& key_padding_mask, const Tensor& ln_weight, const Tensor& ln_bias,
                      const Tensor& wq, const Tensor& bq, const Tensor& wk, const Tensor& bk, const Tensor& wv,
                      const Tensor& bv, const Tensor& wo, const Tensor& bo, int64_t num_heads, double scale,
                      bool causal, bool normalize_before, double eps, double attn_p, double p, int64_t seed,
                      int64_t offset, bool record, Tensor& s, Tensor& mean, Tensor& rstd, Tensor& o, Tensor& qs,
                      Tensor& ks, Tensor& vs) {
  TORCH_CHECK(x.dim() == 3, "attention_block_sdpa: x must be [T, B, E], got ", x.sizes());
  const int64_t Tq = x.size(0), B = x.size(1), E = x.size(2), H = num_heads;
  TORCH_CHECK(H > 0 && E % H == 0, "attention_block_sdpa: num_heads = ", H, " must divide E = ", E);
  Tensor q, k, v;
  {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    const Tensor h2 = norm_start(x, ln_weight, ln_bias, normalize_before, eps, mean, rstd).reshape({Tq * B, E});
    std::tie(q, k, v) = project_qkv(h2, memory, wq, bq, wk, bk, wv, bv, Tq, B, H);
  }
  const int64_t Tk = k.size(1), hd = E / H;
  {
    const at::AutoGradMode grad_mode(record);
    qs = q.view({B, H, Tq, hd}).detach().requires_grad_(record);
    ks = k.view({B, H, Tk, hd}).detach().requires_grad_(record);
    vs = v.view({B, H, Tk, hd}).detach().requires_grad_(record);
    const auto [mask, is_causal] = sdpa_mask(key_padding_mask, causal, Tq, Tk);
    o = at::scaled_dot_product_attention(qs, ks, vs, mask, attn_p, is_causal, scale);
  }
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  const Tensor out = at::mm(o.detach().permute({2, 0, 1, 3}).reshape({Tq * B, E}), wo.t()).view({Tq, B, E});
  return norm_end(out, bo, x, p, seed, offset, ln_weight, ln_bias, normalize_before, eps, s, mean, rstd);
}

struct SdpaAttentionBlockNode : public torch::autograd::Function<SdpaAttentionBlockNode> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const std::optional<Tensor>& memory,
                        const std::optional<Tensor>& key_padding_mask, const Tensor& ln_weight, const Tensor& ln_bias,
                        const Tensor& wq, const Tensor& bq, const Tensor& wk, const Tensor& bk, const Tensor& wv,
                        const Tensor& bv, const Tensor& wo, const Tensor& bo, int64_t num_heads, double scale,
                        bool causal, bool normalize_before, double eps, double attn_p, double p, int64_t seed,
                        int64_t offset, bool recompute) {
    recompute = recompute && attn_p == 0;
    Tensor s, mean, rstd, o, qs, ks, vs;
    const Tensor y = sdpa_block_fwd(x, memory, key_padding_mask, ln_weight, ln_bias, wq, bq, wk, bk, wv, bv, wo, bo,
                                    num_heads, scale, causal, normalize_before, eps, attn_p, p, seed, offset,
                                    /*record=*/!recompute, s, mean, rstd, o, qs, ks, vs);
    ctx->save_for_backward({x, memory.value_or(Tensor()), ln_weight, ln_bias, wq, bq, wk, bk, wv, bv, wo, s, mean,
                            rstd, recompute ? key_padding_mask.value_or(Tensor()) : Tensor()});
    auto& d = ctx->saved_data;
    if (!recompute) d["o"] = o, d["qs"] = qs, d["ks"] = ks, d["vs"] = vs;
    d["num_heads"] = num_heads, d["scale"] = scale, d["causal"] = causal, d["normalize_before"] = normalize_before;
    d["eps"] = eps;
    save_draw(d, "", p, seed, offset);
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list t = ctx->get_saved_variables();
    auto& d = ctx->saved_data;
    const Scalars sc{d};
    const Tensor &x = t[0], &ln_weight = t[2], &ln_bias = t[3], &wq = t[4], &wk = t[6], &wv = t[8], &wo = t[10];
    const std::optional<Tensor> memory = opt(t[1]);
    const int64_t Tq = x.size(0), B = x.size(1), E = x.size(2), H = sc.i("num_heads"), hd = E / H;
    const bool pre_ln = sc.b("normalize_before");
    Tensor ds, dln_w, dln_b, dout, dbo, h, dctx;
    {
      const at::AutoDispatchBelowADInplaceOrView below_autograd;
      h = norm_bwd_start(grads[0].contiguous(), x, t[11], ln_weight, ln_bias, t[12], t[13], pre_ln, sc.f("eps"), ds,
                         dln_w, dln_b);
      std::tie(dout, dbo) = bdr_bwd(ds, sc.f("p"), sc.i("seed"), sc.i("offset"), std::nullopt);
      // [Tq, B, H, hd] as SDPA's [B, H, Tq, hd]
      dctx = at::mm(dout.view({Tq * B, E}), wo).view({Tq, B, H, hd}).permute({1, 2, 0, 3}).contiguous();
    }
    Tensor o, qs, ks, vs;
    if (d.count("o")) {  // SDPA's graph, kept by the forward
      o = d.at("o").toTensor(), qs = d.at("qs").toTensor(), ks = d.at("ks").toTensor(), vs = d.at("vs").toTensor();
    } else {  // recompute: q, k, v from the block input, then SDPA's forward, recorded
      Tensor q, k, v;
      {
        const at::AutoDispatchBelowADInplaceOrView below_autograd;
        std::tie(q, k, v) = project_qkv(h.reshape({Tq * B, E}), memory, wq, t[5], wk, t[7], wv, t[9], Tq, B, H);
      }
      const int64_t Tk = k.size(1);
      const at::AutoGradMode grad_on(true);
      qs = q.view({B, H, Tq, hd}).detach().requires_grad_();
      ks = k.view({B, H, Tk, hd}).detach().requires_grad_();
      vs = v.view({B, H, Tk, hd}).detach().requires_grad_();
      const std::optional<Tensor> kpm = opt(t[14]);
      const auto [mask, is_causal] = sdpa_mask(kpm, sc.b("causal"), Tq, Tk);
      o = at::scaled_dot_product_attention(qs, ks, vs, mask, 0.0, is_causal, sc.f("scale"));
    }
    // retain_graph: a second backward through the outer graph (retain_graph there) needs SDPA's graph
    // again; it is freed with this node.
    const variable_list dqkv = torch::autograd::grad({o}, {qs, ks, vs}, {dctx}, /*retain_graph=*/true);
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    const Tensor dout2 = dout.view({Tq * B, E});
    const Tensor dwo = at::mm(dout2.t(), o.detach().permute({2, 0, 1, 3}).reshape({Tq * B, E}));
    const Tensor h2 = h.reshape({Tq * B, E});
    auto [dh, dmemory, dwq, dbq, dwk, dbk, dwv, dbv] =
        project_qkv_bwd(dqkv[0].reshape({B * H, Tq, hd}), dqkv[1].reshape({B * H, -1, hd}),
                        dqkv[2].reshape({B * H, -1, hd}), h2, memory, wq, wk, wv, H);
    const Tensor dx = norm_bwd_end(ds, dh.view({Tq, B, E}), x, ln_weight, t[12], t[13], pre_ln, dln_w, dln_b);
    variable_list out = {dx, dmemory, Tensor(), dln_w, dln_b, dwq, dbq, dwk, dbk, dwv, dbv, dwo, dbo};
    out.resize(23);  // the 10 scalar arguments
    return out;
  }
};

Tensor attention_block_sdpa(const Tensor& x, const std::optional<Tensor>& memory,
                            const std::optional<Tensor>& key_padding_mask, const Tensor& ln_weight,
                            const Tensor& ln_bias, const Tensor& wq, const Tensor& bq, const Tensor& wk,
                            const Tensor& bk, const Tensor& wv, const Tensor& bv, const Tensor& wo, const Tensor& bo,
                            int64_t num_heads, double scale, bool causal, bool normalize_before, double eps,
                            double attn_p, double p, int64_t seed, int64_t offset, bool recompute) {
  if (!at::GradMode::is_enabled()) {  // no graph to record (evaluation): the forward alone
    Tensor s, mean, rstd, o, qs, ks, vs;
    return sdpa_block_fwd(x, memory, key_padding_mask, ln_weight, ln_bias, wq, bq, wk, bk, wv, bv, wo, bo, num_heads,
                          scale, causal, normalize_before, eps, attn_p, p, seed, offset, false, s, mean, rstd, o, qs,
                          ks, vs);
  }
  return SdpaAttentionBlockNode::apply(x, memory, key_padding_mask, ln_weight, ln_bias, wq, bq, wk, bk, wv, bv, wo,
                                       bo, num_heads, scale, causal, normalize_before, eps, attn_p, p, seed, offset,
                                       recompute);
}

Tensor attention_block(const Tensor& x, const std::optional<Tensor>& memory,
                       const std::optional<Tensor>& key_padding_mask, const Tensor& ln_weight, const Tensor& ln_bias,
                       const Tensor& wq, const Tensor& bq, const Tensor& wk, const Tensor& bk, const Tensor& wv,
                       const Tensor& bv, const Tensor& wo, const Tensor& bo, int64_t num_heads, double scale,
                       bool causal, bool normalize_before, double eps, double attn_p, int64_t attn_seed,
                       int64_t attn_offset, double p, int64_t seed, int64_t offset, bool recompute) {
  return AttentionBlockNode::apply(x, memory, key_padding_mask, ln_weight, ln_bias, wq, bq, wk, bk, wv, bv, wo, bo,
                                   num_heads, scale, causal, normalize_before, eps, attn_p, attn_seed, attn_offset, p,
                                   seed, offset, recompute);
}

Tensor varlen_attention_block(const Tensor& x, const std::optional<Tensor>& memory, const Tensor& cu_q,
                              const Tensor& cu_k, const std::optional<Tensor>& starts,
                              const std::optional<Tensor>& rows, const Tensor& ln_weight, const Tensor& ln_bias,
                              const Tensor& wq, const Tensor& bq, const Tensor& wk, const Tensor& bk,
                              const Tensor& wv, const Tensor& bv, const Tensor& wo, const Tensor& bo,
                              int64_t num_heads, int64_t max_q, int64_t max_k, int64_t padded_q, int64_t padded_k,
                              double scale, bool causal, bool normalize_before, double eps, double attn_p,
                              int64_t attn_seed, int64_t attn_offset, double p, int64_t seed, int64_t offset,
                              bool recompute) {
  return VarlenAttentionBlockNode::apply(x, memory, cu_q, cu_k, starts, rows, ln_weight, ln_bias, wq, bq, wk, bk, wv,
                                         bv, wo, bo, num_heads, max_q, max_k, padded_q, padded_k, scale, causal,
                                         normalize_before, eps, attn_p, attn_seed, attn_offset, p, seed, offset,
                                         recompute);
}

// Below autograd (inference mode): the forward alone.
Tensor varlen_attention_block_inference(const Tensor& x, const std::optional<Tensor>& memory, const Tensor& cu_q,
                              const Tensor& cu_k, const std::optional<Tensor>& starts,
                              const std::optional<Tensor>& rows, const Tensor& ln_weight, const Tensor& ln_bias,
                              const Tensor& wq, const Tensor& bq, const Tensor& wk, const Tensor& bk,
                              const Tensor& wv, const Tensor& bv, const Tensor& wo, const Tensor& bo,
                              int64_t num_heads, int64_t max_q, int64_t max_k, int64_t padded_q, int64_t padded_k,
                              double scale, bool causal, bool normalize_before, double eps, double attn_p,
                              int64_t attn_seed, int64_t attn_offset, double p, int64_t seed, int64_t offset,
                              bool /*recompute*/) {
  return std::get<0>(varlen_attention_block_fwd(x, memory, cu_q, cu_k, starts, rows, ln_weight, ln_bias, wq, bq, wk,
                                                bk, wv, bv, wo, bo, num_heads, max_q, max_k, padded_q, padded_k, scale,
                                                causal, normalize_before, eps, attn_p, attn_seed, attn_offset, p,
                                                seed, offset));
}

// Below autograd (inference mode): the forward alone.
Tensor attention_block_inference(const Tensor& x, const std::optional<Tensor>& memory,
                                 const std::optional<Tensor>& key_padding_mask, const Tensor& ln_weight,
                                 const Tensor& ln_bias, const Tensor& wq, const Tensor& bq, const Tensor& wk,
                                 const Tensor& bk, const Tensor& wv, const Tensor& bv, const Tensor& wo,
                                 const Tensor& bo, int64_t num_heads, double scale, bool causal, bool normalize_before,
                                 double eps, double attn_p, int64_t attn_seed, int64_t attn_offset, double p,
                                 int64_t seed, int64_t offset, bool /*recompute*/) {
  return std::get<0>(attention_block_fwd(x, memory, key_padding_mask, ln_weight, ln_bias, wq, bq, wk, bk, wv, bv, wo,
                                         bo, num_heads, scale, causal, normalize_before, eps, attn_p, attn_seed,
                                         attn_offset, p, seed, offset));
}

Tensor ffn_block(const Tensor& x, const Tensor& ln_weight, const Tensor& ln_bias, const Tensor& w1, const Tensor& b1,
                 const Tensor& w2, const Tensor& b2, c10::string_view act, bool normalize_before, double eps,
                 double act_p, int64_t act_seed, int64_t act_offset, double p, int64_t seed, int64_t offset,
                 const std::optional<Tensor>& rows) {
  return FeedForwardBlockNode::apply(x, ln_weight, ln_bias, w1, b1, w2, b2, act, normalize_before, eps, act_p,
                                     act_seed, act_offset, p, seed, offset, rows);
}

Tensor ffn_block_inference(const Tensor& x, const Tensor& ln_weight, const Tensor& ln_bias, const Tensor& w1,
                           const Tensor& b1, const Tensor& w2, const Tensor& b2, c10::string_view act,
                           bool normalize_before, double eps, double act_p, int64_t act_seed, int64_t act_offset,
                           double p, int64_t seed, int64_t offset, const std::optional<Tensor>& rows) {
  return std::get<0>(ffn_block_fwd(x, ln_weight, ln_bias, w1, b1, w2, b2, act, normalize_before, eps, act_p, act_seed,
                                   act_offset, p, seed, offset, rows));
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(fairseq_lightseq, m) {
  m.def(
      "attention_block(Tensor x, Tensor? memory, Tensor? key_padding_mask, Tensor ln_weight, Tensor ln_bias, "
      "Tensor wq, Tensor bq, Tensor wk, Tensor bk, Tensor wv, Tensor bv, Tensor wo, Tensor bo, int num_heads, "
      "float scale, bool causal, bool normalize_before, float eps, float attn_p, int attn_seed, int attn_offset, "
      "float p, int seed, int offset, bool recompute) -> Tensor");
  m.def(
      "ffn_block(Tensor x, Tensor ln_weight, Tensor ln_bias, Tensor w1, Tensor b1, Tensor w2, Tensor b2, str act, "
      "bool normalize_before, float eps, float act_p, int act_seed, int act_offset, float p, int seed, int offset, "
      "Tensor? rows=None) -> Tensor");
  m.def(
      "attention_block_sdpa(Tensor x, Tensor? memory, Tensor? key_padding_mask, Tensor ln_weight, Tensor ln_bias, "
      "Tensor wq, Tensor bq, Tensor wk, Tensor bk, Tensor wv, Tensor bv, Tensor wo, Tensor bo, int num_heads, "
      "float scale, bool causal, bool normalize_before, float eps, float attn_p, float p, int seed, int offset, "
      "bool recompute) -> Tensor");
  m.def(
      "varlen_attention_block(Tensor x, Tensor? memory, Tensor cu_seqlens_q, Tensor cu_seqlens_k, Tensor? starts, "
      "Tensor? rows, Tensor ln_weight, Tensor ln_bias, Tensor wq, Tensor bq, Tensor wk, Tensor bk, Tensor wv, "
      "Tensor bv, Tensor wo, Tensor bo, int num_heads, int max_seqlen_q, int max_seqlen_k, int padded_q, "
      "int padded_k, float scale, bool causal, bool normalize_before, float eps, float attn_p, int attn_seed, "
      "int attn_offset, float p, int seed, int offset, bool recompute) -> Tensor");
  m.def(
      "varlen_attention_block_fwd(Tensor x, Tensor? memory, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
      "Tensor? starts, Tensor? rows, Tensor ln_weight, Tensor ln_bias, Tensor wq, Tensor bq, Tensor wk, Tensor bk, "
      "Tensor wv, Tensor bv, Tensor wo, Tensor bo, int num_heads, int max_seqlen_q, int max_seqlen_k, int padded_q, "
      "int padded_k, float scale, bool causal, bool normalize_before, float eps, float attn_p, int attn_seed, "
      "int attn_offset, float p, int seed, int offset) -> (Tensor y, Tensor s, Tensor mean, Tensor rstd, "
      "Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v)");
  m.def(
      "varlen_attention_block_bwd(Tensor dy, Tensor x, Tensor? memory, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
      "Tensor? starts, Tensor? rows, Tensor ln_weight, Tensor ln_bias, Tensor wq, Tensor bq, Tensor wk, Tensor bk, "
      "Tensor wv, Tensor bv, Tensor wo, Tensor? s, Tensor mean, Tensor rstd, Tensor? out, Tensor? lse, Tensor? q, "
      "Tensor? k, Tensor? v, int num_heads, int max_seqlen_q, int max_seqlen_k, int padded_q, int padded_k, "
      "float scale, bool causal, bool normalize_before, float eps, float attn_p, int attn_seed, int attn_offset, "
      "float p, int seed, int offset) -> (Tensor dx, Tensor dmemory, Tensor dln_weight, Tensor dln_bias, "
      "Tensor dwq, Tensor dbq, Tensor dwk, Tensor dbk, Tensor dwv, Tensor dbv, Tensor dwo, Tensor dbo)");
  m.def(
      "attention_block_fwd(Tensor x, Tensor? memory, Tensor? key_padding_mask, Tensor ln_weight, Tensor ln_bias, "
      "Tensor wq, Tensor bq, Tensor wk, Tensor bk, Tensor wv, Tensor bv, Tensor wo, Tensor bo, int num_heads, "
      "float scale, bool causal, bool normalize_before, float eps, float attn_p, int attn_seed, int attn_offset, "
      "float p, int seed, int offset) -> (Tensor y, Tensor s, Tensor mean, Tensor rstd, Tensor probs, Tensor q, "
      "Tensor k, Tensor v, Tensor merged)");
  m.def(
      "attention_block_bwd(Tensor dy, Tensor x, Tensor? memory, Tensor ln_weight, Tensor ln_bias, Tensor wq, "
      "Tensor bq, Tensor wk, Tensor bk, Tensor wv, Tensor bv, Tensor wo, Tensor? s, Tensor mean, Tensor rstd, "
      "Tensor probs, Tensor? q, Tensor? k, Tensor? v, Tensor? merged, int num_heads, float scale, bool normalize_before, float eps, float attn_p, "
      "int attn_seed, int attn_offset, float p, int seed, int offset) -> (Tensor dx, Tensor dmemory, "
      "Tensor dln_weight, Tensor dln_bias, Tensor dwq, Tensor dbq, Tensor dwk, Tensor dbk, Tensor dwv, Tensor dbv, "
      "Tensor dwo, Tensor dbo)");
  m.def(
      "ffn_block_fwd(Tensor x, Tensor ln_weight, Tensor ln_bias, Tensor w1, Tensor b1, Tensor w2, Tensor b2, "
      "str act, bool normalize_before, float eps, float act_p, int act_seed, int act_offset, float p, int seed, "
      "int offset, Tensor? rows=None) -> (Tensor y, Tensor pre, Tensor s, Tensor mean, Tensor rstd)");
  m.def(
      "ffn_block_bwd(Tensor dy, Tensor x, Tensor ln_weight, Tensor ln_bias, Tensor w1, Tensor b1, Tensor w2, "
      "Tensor pre, Tensor? s, Tensor mean, Tensor rstd, str act, bool normalize_before, float eps, float act_p, "
      "int act_seed, int act_offset, float p, int seed, int offset, Tensor? rows=None) -> (Tensor dx, "
      "Tensor dln_weight, Tensor dln_bias, Tensor dw1, Tensor db1, Tensor dw2, Tensor db2)");
}

// Compositions of the library's ops and ATen: one registration for every device those have kernels for.
TORCH_LIBRARY_IMPL(fairseq_lightseq, CompositeExplicitAutograd, m) {
  m.impl("attention_block_fwd", &attention_block_fwd);
  m.impl("attention_block_bwd", &attention_block_bwd);
  m.impl("ffn_block_fwd", &ffn_block_fwd);
  m.impl("ffn_block_bwd", &ffn_block_bwd);
  m.impl("varlen_attention_block_fwd", &varlen_attention_block_fwd);
  m.impl("varlen_attention_block_bwd", &varlen_attention_block_bwd);
  m.impl("varlen_attention_block", &varlen_attention_block_inference);
  m.impl("attention_block", &attention_block_inference);
  m.impl("ffn_block", &ffn_block_inference);
  m.impl("attention_block_sdpa", &attention_block_sdpa);  // below autograd: grad mode decides (off: forward only)
}

// The one-node sublayers: C++ autograd nodes (the forward and backward never enter Python).
TORCH_LIBRARY_IMPL(fairseq_lightseq, Autograd, m) {
  m.impl("attention_block", &attention_block);
  m.impl("ffn_block", &ffn_block);
  m.impl("varlen_attention_block", &varlen_attention_block);
  m.impl("attention_block_sdpa", &attention_block_sdpa);
}

}  // namespace fls
