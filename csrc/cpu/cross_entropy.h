// CPU kernels of the label-smoothed cross-entropy family (formulas in fls/label_smoothing.h).
#pragma once
#include <cstdint>

#include "cpu_common.h"

namespace fls {
namespace cpu {

// Per row of logits [rows, V] T with target [rows] int64: loss, nll, lse: [rows] acc_t<T>.
// Rows whose target == ignore_index get loss = nll = lse = 0 and are not read.
// Targets must already be checked to lie in [0, V) (or equal ignore_index).
template <typename T>
void ls_cross_entropy_fwd(const T* logits, const int64_t* target, acc_t<T>* loss, acc_t<T>* nll, acc_t<T>* lse,
                          int64_t rows, int64_t V, double epsilon, int64_t ignore_index);

// dlogits [rows, V] T from the upstream gradients dloss, dnll: [rows] acc_t<T> and the saved lse;
// zero rows where target == ignore_index. dlogits may alias logits (each element is read before
// it is written, by the same thread).
template <typename T>
void ls_cross_entropy_bwd(const acc_t<T>* dloss, const acc_t<T>* dnll, const T* logits, const int64_t* target,
                          const acc_t<T>* lse, T* dlogits, int64_t rows, int64_t V, double epsilon,
                          int64_t ignore_index);

}  // namespace cpu
}  // namespace fls
