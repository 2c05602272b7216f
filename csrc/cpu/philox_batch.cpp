// Batched Philox4x32-10 (see philox_batch.h).
#include "philox_batch.h"

#include <algorithm>

namespace fls {
namespace cpu {

FLS_CPU_CLONES void philox_words(uint64_t g0, int64_t n, uint64_t seed, uint32_t* u) {
  constexpr int kW = 16;
  for (int64_t base = 0; base < n; base += kW) {
    uint32_t c0[kW], c1[kW], c2[kW], c3[kW];
    for (int i = 0; i < kW; ++i) {
      const uint64_t g = g0 + static_cast<uint64_t>(base + i);
      c0[i] = static_cast<uint32_t>(g);
      c1[i] = static_cast<uint32_t>(g >> 32);
      c2[i] = 0;
      c3[i] = 0;
    }
    uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
    for (int r = 0; r < 10; ++r) {  // the key is bumped after each round: the same as philox.h
      for (int i = 0; i < kW; ++i) {
        const uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * c0[i];
        const uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * c2[i];
        const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1[i] ^ k0;
        const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3[i] ^ k1;
        c0[i] = n0;
        c1[i] = static_cast<uint32_t>(p1);
        c2[i] = n2;
        c3[i] = static_cast<uint32_t>(p0);
      }
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    const int m = static_cast<int>(std::min<int64_t>(kW, n - base));
    for (int i = 0; i < m; ++i) {
      uint32_t* w = u + 4 * (base + i);
      w[0] = c0[i];
      w[1] = c1[i];
      w[2] = c2[i];
      w[3] = c3[i];
    }
  }
}

}  // namespace cpu
}  // namespace fls
