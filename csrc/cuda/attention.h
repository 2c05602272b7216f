// CUDA launchers of the attention family (csrc/cuda/attention.cu). Plain C++ declarations so the ATen
// wrapper can include them without CUDA headers; each returns a cudaError_t as int (0 = ok).
#pragma once
#include <cstdint>

#include "fls/common.h"

namespace fls {
namespace cuda {

// scores, y: [B, H, Tq, Tk] dt; key_padding_mask: [B, Tk] bool or nullptr; out: same as y, written
// only when d.threshold > 0. B*H*Tq <= 2^31-1, any Tk, fp32 math: a register-resident group of lanes
// per row when Tk <= 1024, Tk % (16 / element size) == 0 and the pointers are aligned, else a block per row.
int attention_softmax_fwd(DType dt, const void* scores, const bool* key_padding_mask, void* y, void* out, int64_t B,
                          int64_t H, int64_t Tq, int64_t Tk, bool causal, float scale, const DropoutParams& d,
                          void* stream);

// dout, y, dscores: [rows, Tk] dt.
int attention_softmax_bwd(DType dt, const void* dout, const void* y, void* dscores, int64_t rows, int64_t Tk,
                          float scale, const DropoutParams& d, void* stream);

// out[p][((b*H + h)*T + t)*hd + c] = x[(t*B + b)*row_stride + p*H*hd + h*hd + c] + bias[p*H*hd + h*hd + c],
// p < nparts <= 3.
int split_heads(DType dt, const void* x, int64_t row_stride, const void* bias, void* const* out, int nparts,
                int64_t T, int64_t B, int64_t H, int64_t hd, void* stream);

// The inverse permutation (no bias): y[(t*B + b)*row_stride + p*E + h*hd + c] = in[p][((b*H + h)*T + t)*hd + c].
int merge_heads(DType dt, const void* const* in, int nparts, void* y, int64_t row_stride, int64_t T, int64_t B,
                int64_t H, int64_t hd, void* stream);

// Floats of scratch memory split_heads_bwd needs (per-chunk partial column sums of dqkv).
int64_t split_heads_bwd_workspace(int64_t rows, int64_t cols);

// Backward of the qkv split: dqkv [T, B, 3E] = merge of in[0..2] ([B*H, T, hd] each), and
// dbias [3E] = column sums of dqkv in a fixed order (deterministic).
int split_heads_bwd(DType dt, const void* const* in, void* dqkv, void* dbias, float* workspace, int64_t T, int64_t B,
                    int64_t H, int64_t hd, void* stream);

}  // namespace cuda
}  // namespace fls
