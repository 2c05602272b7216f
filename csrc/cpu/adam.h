// CPU kernel of the fused multi-tensor Adam step (per-element math in fls/adam.h).
#pragma once
#include <cstdint>

#include "cpu_common.h"
#include "fls/adam.h"

namespace fls {
namespace cpu {

// Updates every tensor of `tensors` in place: p, m, v fp32 [n]; g: G [n] (float, c10::Half or
// c10::BFloat16), read only. Work is split into fixed chunks over all tensors together, so many
// small tensors (biases, norms) share threads with large ones.
template <typename G>
void adam_step(const AdamTensor* tensors, int64_t num_tensors, const AdamCoeffs& c);

}  // namespace cpu
}  // namespace fls
