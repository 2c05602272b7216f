// The per-element Adam update of fairseq's `adam` optimizer (fairseq/optim/adam.py), shared by the
// CPU and CUDA kernels so that the CPU tests check the very formula the GPU runs.
#pragma once
#include <cmath>
#include <cstdint>

#include "fls/common.h"

namespace fls {

// Scalars of one step, computed once on the host in double precision and rounded to float
// (as torch rounds its Python-float scalars for fp32 tensors).
struct AdamCoeffs {
  float beta1, one_minus_beta1;  // m = beta1*m + (1-beta1)*g
  float beta2, one_minus_beta2;  // v = beta2*v + (1-beta2)*g^2
  float eps;                     // denom = sqrt(v) + eps
  float step_size;               // lr * sqrt(1 - beta2^step) / (1 - beta1^step)
  float decay;                   // weight_decay * lr, applied as p -= decay*p before the step
  float grad_scale;              // g is multiplied by this first (fused unscaling)
};

inline AdamCoeffs make_adam_coeffs(int64_t step, double lr, double beta1, double beta2, double eps,
                                   double weight_decay, double grad_scale) {
  const double bc1 = 1.0 - std::pow(beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(beta2, static_cast<double>(step));
  AdamCoeffs c;
  c.beta1 = static_cast<float>(beta1);
  c.one_minus_beta1 = static_cast<float>(1.0 - beta1);
  c.beta2 = static_cast<float>(beta2);
  c.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  c.eps = static_cast<float>(eps);
  c.step_size = static_cast<float>(lr * std::sqrt(bc2) / bc1);
  c.decay = static_cast<float>(weight_decay * lr);
  c.grad_scale = static_cast<float>(grad_scale);
  return c;
}

// One element, in the order fairseq's adam applies its tensor ops: moments, denominator, weight
// decay (p -= wd*lr*p, AdamW-like, on the pre-step value), then p -= step_size * m / denom.
FLS_HD void adam_update(float& p, float& m, float& v, float g, const AdamCoeffs& c) {
  g *= c.grad_scale;
  m = m * c.beta1 + c.one_minus_beta1 * g;
  v = v * c.beta2 + c.one_minus_beta2 * g * g;
  const float denom = sqrtf(v) + c.eps;
  p = p - c.decay * p;
  p = p - c.step_size * (m / denom);
}

// One tensor of a multi-tensor step: raw pointers and the element count. The grad's storage
// dtype is given per launch (all tensors of one kernel launch share it).
struct AdamTensor {
  float* p;
  const void* g;
  float* m;
  float* v;
  int64_t n;
};

}  // namespace fls
