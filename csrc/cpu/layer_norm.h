#pragma once
#include <cstdint>

#include "cpu_common.h"

namespace fls {
namespace cpu {

// y = (x - mean) * rstd * weight + bias over the last dimension.
// x, y: [rows, cols] T; weight, bias: [cols] T; mean, rstd: [rows] acc_t<T> (saved for backward).
template <typename T>
void layer_norm_fwd(const T* x, const T* weight, const T* bias, T* y, acc_t<T>* mean, acc_t<T>* rstd,
                    int64_t rows, int64_t cols, double eps);

// dx: [rows, cols] T; dweight, dbias: [cols] T. Column sums are taken in a fixed order, so results
// do not depend on the thread count.
template <typename T>
void layer_norm_bwd(const T* dy, const T* x, const T* weight, const acc_t<T>* mean, const acc_t<T>* rstd, T* dx,
                    T* dweight, T* dbias, int64_t rows, int64_t cols);

}  // namespace cpu
}  // namespace fls
