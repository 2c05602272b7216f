// Branch-free float exp shared by the CPU kernels (attention softmax, cross entropy, activations) and
// the CUDA activations. No ATen here: csrc/cuda/*.cu include it through fls/activations.h.
#pragma once
#include <stdint.h>
#include <string.h>

#include "fls/common.h"

namespace fls {

FLS_HD float bits_as_float(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}
FLS_HD uint32_t float_as_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
}

// lo where x < lo, else x (NaN passes through), as a bit select: GCC (without -ffast-math and with
// trapping math) does not if-convert a float ?: / std::max inside a loop body, which then stays scalar.
FLS_HD float clamp_below(float x, float lo) {
  const uint32_t take = 0u - static_cast<uint32_t>(x < lo);
  return bits_as_float((float_as_bits(x) & ~take) | (float_as_bits(lo) & take));
}
FLS_HD float clamp_above(float x, float hi) {
  const uint32_t take = 0u - static_cast<uint32_t>(x > hi);
  return bits_as_float((float_as_bits(x) & ~take) | (float_as_bits(hi) & take));
}

// exp(x) in float, Cephes expf: x = n ln2 + r (ln2 split in two so n ln2 is exact), |r| <= ln2/2,
// exp(r) by a degree-6 polynomial, times 2^n built from exponent bits; about 1 ulp. Straight-line
// arithmetic and bit selects, so `#pragma omp simd` / plain row loops vectorise it (std::exp is a
// scalar libm call) and it costs a few FMAs on the GPU.
//   x is clamped to [-104, 88] (-inf, e.g. a masked attention score, included) and n at -127, whose
//   exponent bits encode exactly 0: x below about -88 gives 0 (x in about [-88, -87.3] a denormal),
//   x above 88 gives exp(88). NaN gives NaN.
// round(x / ln2) uses the 1.5 * 2^23 trick (exact for |n| < 2^22, no rounding-mode call).
// exp_nonpos_f32 is the same function for x <= 88 (softmax / log-sum-exp arguments x - max <= 0),
// without the upper clamp.
FLS_HD float exp_nonpos_f32(float x) {
  x = clamp_below(x, -104.0f);
  const float magic = 12582912.0f;
  const float n = (x * 1.44269504088896341f + magic) - magic;
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float e = p * r * r + r + 1.0f;
  int32_t ni = static_cast<int32_t>(n);
  ni = ni < -127 ? -127 : ni;
  return e * bits_as_float(static_cast<uint32_t>(ni + 127) << 23);
}
FLS_HD float exp_f32(float x) { return exp_nonpos_f32(clamp_above(x, 88.0f)); }

// a / b for b in [1, inf] (NaN passes through). On the GPU one approximate reciprocal and a multiply
// (__fdividef, within 2 ulp): an IEEE divide there is a reciprocal, refinement FMAs and a branch to a
// slow-path subroutine per element. The vectorised fp16 gelu kernels had 16 (forward) and 53
// (backward) such calls in their SASS, and reached 33% / 43% of copy bandwidth on an H200, against
// relu's 68% / 73%. __fdividef returns 0 for b > 2^126, the right limit for the callers (a / b there
// is below float's precision of their 1 - a / b). The CPU divides exactly (and vectorises the divide).
FLS_HD float div_ge1(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fdividef(a, b);
#else
  return a / b;
#endif
}

}  // namespace fls
