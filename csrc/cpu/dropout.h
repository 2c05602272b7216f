#pragma once
#include <cstdint>

#include "cpu_common.h"
#include "fls/activations.h"
#include "fls/philox.h"

namespace fls {
namespace cpu {

// keep[e] = Philox keep bit of stream element d.offset + e, e in [0, n) (see fls/philox.h).
void dropout_mask(bool* keep, int64_t n, const DropoutParams& d);

// y = residual + dropout(act(x + bias)), or dropout(act(x + bias)) when residual is null.
// x, residual, y: [rows, cols] T; bias: [cols] T. Element e = r * cols + c uses stream index d.offset + e.
template <typename T>
void bias_act_dropout_fwd(const T* x, const T* bias, const T* residual, T* y, int64_t rows, int64_t cols, Act act,
                          const DropoutParams& d);

// dx = dy * dropout_factor * act'(x + bias) with the mask regenerated from (d.seed, d.offset) rather than
// stored; dbias = column sums of dx, taken before rounding to T, over fixed chunks of rows and then in a
// fixed order, so the result does not depend on the thread count. x and bias are not read for
// Act::kIdentity (may be null). dy, x, dx: [rows, cols] T; bias, dbias: [cols] T.
template <typename T>
void bias_act_dropout_bwd(const T* dy, const T* x, const T* bias, T* dx, T* dbias, int64_t rows, int64_t cols,
                          Act act, const DropoutParams& d);

}  // namespace cpu
}  // namespace fls
