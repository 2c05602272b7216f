// Activations of the bias+activation+dropout op and their derivatives, written once for the CPU
// kernels (float and double) and the CUDA kernels (float math for fp32/fp16/bf16 storage), so the
// CPU tests exercise the very formulas the GPU runs. They match
// fairseq_lightseq/ops/reference/dropout.py::activation:
//   relu(x)      = max(x, 0)                                   relu'(0) = 0, like torch.relu
//   gelu(x)      = 0.5 x (1 + erf(x / sqrt 2))                  (fairseq "gelu")
//   gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))   (fairseq "gelu_accurate")
// No ATen here: csrc/cuda/*.cu include this and must compile with plain `nvcc -c`.
#pragma once
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "fls/common.h"
#include "fls/fast_math.h"

namespace fls {

// Identity is the "no activation" case, used by bias+dropout+residual so both ops share kernels.
enum class Act : int { kIdentity = 0, kRelu = 1, kGelu = 2, kGeluTanh = 3 };

namespace act_const {
constexpr double kInvSqrt2 = 0.70710678118654752440;     // 1 / sqrt(2)
constexpr double kInvSqrt2Pi = 0.39894228040143267794;   // 1 / sqrt(2 pi): the normal pdf at 0
constexpr double kSqrt2OverPi = 0.79788456080286535588;  // sqrt(2 / pi)
constexpr double kTanhCubic = 0.044715;
}  // namespace act_const

// --- float exp, erf and tanh, branch-free ---
// libm's expf/erff/tanhf are opaque calls that keep the CPU loops scalar (about 10x slower than
// torch's vectorised gelu). These versions are straight-line float arithmetic and selects that
// the compiler vectorises on the CPU and that cost a few FMAs on the GPU; their absolute error
// (< 3e-7) is far below the fp32 kernel tolerance. torch's own vectorised CPU erf uses the same
// Abramowitz-Stegun formula. float64 uses libm (gradcheck wants full precision). exp_f32 is in
// fls/fast_math.h.

// erf(x), Abramowitz & Stegun 7.1.26: |error| < 1.5e-7 (plus float rounding). `e` must be
// exp_f32(-x * x), passed in so gelu_grad can reuse it for the normal pdf.
FLS_HD float erf_f32(float x, float e) {
  const float a = x < 0.0f ? -x : x;
  const float t = div_ge1(1.0f, 1.0f + 0.3275911f * a);
  float q = 1.061405429f;
  q = q * t - 1.453152027f;
  q = q * t + 1.421413741f;
  q = q * t - 0.284496736f;
  q = q * t + 0.254829592f;
  const float y = 1.0f - q * t * e;
  return x < 0.0f ? -y : y;
}
FLS_HD float erf_f32(float x) { return erf_f32(x, exp_f32(-x * x)); }

// tanh(u) = 1 - 2 / (exp(2|u|) + 1) with u's sign; absolute error about 1e-7.
FLS_HD float tanh_f32(float u) {
  const float a = u < 0.0f ? -u : u;
  const float t = 1.0f - div_ge1(2.0f, exp_f32(2.0f * a) + 1.0f);
  return u < 0.0f ? -t : t;
}

// --- gelu (erf form) ---
FLS_HD float gelu(float x) { return 0.5f * x * (1.0f + erf_f32(x * static_cast<float>(act_const::kInvSqrt2))); }
FLS_HD double gelu(double x) { return 0.5 * x * (1.0 + erf(x * act_const::kInvSqrt2)); }

// d/dx [x Phi(x)] = Phi(x) + x phi(x).
FLS_HD float gelu_grad(float x) {
  const float z = x * static_cast<float>(act_const::kInvSqrt2);
  const float e = exp_f32(-z * z);  // exp(-x^2/2): in erf(z) and in the pdf
  const float cdf = 0.5f * (1.0f + erf_f32(z, e));
  return cdf + x * e * static_cast<float>(act_const::kInvSqrt2Pi);
}
FLS_HD double gelu_grad(double x) {
  const double cdf = 0.5 * (1.0 + erf(x * act_const::kInvSqrt2));
  const double pdf = exp(-0.5 * x * x) * act_const::kInvSqrt2Pi;
  return cdf + x * pdf;
}

// --- gelu (tanh approximation) ---
FLS_HD float gelu_tanh(float x) {
  const float u = static_cast<float>(act_const::kSqrt2OverPi) * (x + static_cast<float>(act_const::kTanhCubic) * x * x * x);
  return 0.5f * x * (1.0f + tanh_f32(u));
}
FLS_HD double gelu_tanh(double x) {
  const double u = act_const::kSqrt2OverPi * (x + act_const::kTanhCubic * x * x * x);
  return 0.5 * x * (1.0 + tanh(u));
}

// d/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2), t = tanh(u).
// x^2 is capped at 1e30: beyond |x| ~ 1.8e19 it overflows float, and the saturated gradient (t = +-1,
// so 1 - t^2 = 0) would become 0 * inf = NaN instead of 1 or 0 (PyTorch's own fp32 gelu backward
// has that NaN). Below the cap nothing changes: there 1 - t^2 is already 0 for |x| > ~5.
FLS_HD float gelu_tanh_grad(float x) {
  const float k0 = static_cast<float>(act_const::kSqrt2OverPi), k1 = static_cast<float>(act_const::kTanhCubic);
  const float x2 = clamp_above(x * x, 1e30f);
  const float t = tanh_f32(k0 * (x + k1 * x2 * x));
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * k0 * (1.0f + 3.0f * k1 * x2);
}
FLS_HD double gelu_tanh_grad(double x) {
  const double k0 = act_const::kSqrt2OverPi, k1 = act_const::kTanhCubic;
  const double t = tanh(k0 * (x + k1 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k0 * (1.0 + 3.0 * k1 * x * x);
}

// --- dispatch on the activation at compile time (F = float or double) ---
template <Act A, typename F>
FLS_HD F act_fwd(F x) {
  if constexpr (A == Act::kRelu) {
    return x > F(0) ? x : F(0);
  } else if constexpr (A == Act::kGelu) {
    return gelu(x);
  } else if constexpr (A == Act::kGeluTanh) {
    return gelu_tanh(x);
  } else {
    return x;
  }
}

template <Act A, typename F>
FLS_HD F act_grad(F x) {
  if constexpr (A == Act::kRelu) {
    return x > F(0) ? F(1) : F(0);
  } else if constexpr (A == Act::kGelu) {
    return gelu_grad(x);
  } else if constexpr (A == Act::kGeluTanh) {
    return gelu_tanh_grad(x);
  } else {
    return F(1);
  }
}

}  // namespace fls
