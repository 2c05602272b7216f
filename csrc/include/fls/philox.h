// Philox4x32-10 counter-based generator (Salmon et al., SC'11), the one source of dropout masks.
//
// The mask bit of element e of a draw with (seed, offset) is a pure function of (seed, offset + e):
//   g = (offset + e) / 4, lane = (offset + e) % 4
//   (u0,u1,u2,u3) = philox4x32_10(counter = (lo32(g), hi32(g), 0, 0), key = (lo32(seed), hi32(seed)))
//   keep(e) = (u_lane >> 8) >= threshold,  threshold = floor(p * 2^24)
// so CPU, CUDA and the pure-PyTorch reference (fairseq_lightseq/ops/reference/philox.py) draw
// bitwise-identical masks, and backward regenerates the mask instead of storing it.
#pragma once
#include "fls/common.h"

namespace fls {

struct U32x4 {
  uint32_t v[4];
};

FLS_HD void mulhilo32(uint32_t a, uint32_t b, uint32_t* hi, uint32_t* lo) {
  uint64_t p = static_cast<uint64_t>(a) * static_cast<uint64_t>(b);
  *hi = static_cast<uint32_t>(p >> 32);
  *lo = static_cast<uint32_t>(p);
}

FLS_HD U32x4 philox4x32_10(uint64_t group, uint64_t seed) {
  uint32_t c0 = static_cast<uint32_t>(group), c1 = static_cast<uint32_t>(group >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
#ifdef __CUDACC__
#pragma unroll
#endif
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo32(0xD2511F53u, c0, &hi0, &lo0);
    mulhilo32(0xCD9E8D57u, c2, &hi1, &lo1);
    uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
  }
  U32x4 out;
  out.v[0] = c0;
  out.v[1] = c1;
  out.v[2] = c2;
  out.v[3] = c3;
  return out;
}

FLS_HD bool dropout_keep_bit(uint32_t u, uint32_t threshold) { return (u >> 8) >= threshold; }

// Keep bits of the 4 stream elements 4*group .. 4*group+3, as bits 0..3 of the result.
FLS_HD uint32_t dropout_keep4(uint64_t group, const DropoutParams& d) {
  U32x4 u = philox4x32_10(group, d.seed);
  return (dropout_keep_bit(u.v[0], d.threshold) ? 1u : 0u) | (dropout_keep_bit(u.v[1], d.threshold) ? 2u : 0u) |
         (dropout_keep_bit(u.v[2], d.threshold) ? 4u : 0u) | (dropout_keep_bit(u.v[3], d.threshold) ? 8u : 0u);
}

// Keep bit of a single element `e` of the draw (slow path: one Philox call per element).
FLS_HD bool dropout_keep(uint64_t e, const DropoutParams& d) {
  uint64_t s = d.offset + e;
  return (dropout_keep4(s >> 2, d) >> (s & 3)) & 1u;
}

// Multiplier of element `e`: scale if kept, 0 if dropped, 1 when dropout is off.
FLS_HD float dropout_factor(uint64_t e, const DropoutParams& d) {
  if (d.threshold == 0) return 1.0f;
  return dropout_keep(e, d) ? d.scale : 0.0f;
}

}  // namespace fls
