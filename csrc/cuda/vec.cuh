// 16-byte vectors of a storage type (Pack<T>, the unit of the fast paths' loads and stores) and the
// alignment tests that decide whether a fast path may run.
#pragma once
#include <cstdint>

#include "dtype.cuh"

namespace fls {
namespace cuda {

// 16 bytes of T (kN elements): the unit of the fast paths' vector loads and stores. Kernels load it
// either as a Pack<T> and read its elements v[j], or as one uint4 whose elements are unpacked from / packed
// into its 32-bit words with register moves only (j is a compile-time constant after unrolling), so the
// pack never goes through local memory. Both views are kept: each is what gave the fewest registers
// without spills in the kernels that use it (checked with -Xptxas -v).
template <typename T>
struct alignas(16) Pack {
  static constexpr int kN = 16 / sizeof(T);
  T v[kN];
};

__device__ __forceinline__ uint32_t word(const uint4& u, int i) {
  return i == 0 ? u.x : (i == 1 ? u.y : (i == 2 ? u.z : u.w));
}

template <typename T>
__device__ __forceinline__ float unpack(const uint4& u, int j);
template <>
__device__ __forceinline__ float unpack<float>(const uint4& u, int j) { return __uint_as_float(word(u, j)); }
template <>
__device__ __forceinline__ float unpack<__half>(const uint4& u, int j) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(word(u, j >> 1) >> ((j & 1) * 16))));
}
template <>
__device__ __forceinline__ float unpack<__nv_bfloat16>(const uint4& u, int j) {
  return __bfloat162float(__ushort_as_bfloat16(static_cast<unsigned short>(word(u, j >> 1) >> ((j & 1) * 16))));
}

// All kN elements of u as floats. u by value: a caller's `unpack<T>(p[i], f)` reads p[i] once, as one 16-byte
// load, before unpacking (by reference the host compiler of the emulated device reads the words one by one,
// each twice, and the kernel profile would count that).
template <typename T>
__device__ __forceinline__ void unpack(const uint4 u, float (&f)[Pack<T>::kN]) {
#pragma unroll
  for (int j = 0; j < Pack<T>::kN; ++j) f[j] = unpack<T>(u, j);
}

__device__ __forceinline__ uint32_t bits16(__half h) { return __half_as_ushort(h); }
__device__ __forceinline__ uint32_t bits16(__nv_bfloat16 h) { return __bfloat16_as_ushort(h); }

// The kN floats f rounded once to T and packed in element order.
template <typename T>
__device__ __forceinline__ uint4 pack(const float* f) {
  if constexpr (sizeof(T) == 4) {
    return make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]), __float_as_uint(f[3]));
  } else {
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = bits16(from_float<T>(f[2 * i])) | (bits16(from_float<T>(f[2 * i + 1])) << 16);
    return make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// Whether p allows 16-byte vector accesses.
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The same for an optional pointer: an absent (null) one does not prevent the vector path.
inline bool aligned16_or_null(const void* p) { return p == nullptr || aligned16(p); }

}  // namespace cuda
}  // namespace fls
