// The CUDA execution model on the CPU, for the kernels of csrc/cuda/ compiled by the host C++ compiler.
//
// The emulated build compiles every csrc/cuda/*.cu file as C++ with this header force-included
// (-x c++ -include csrc/emulation/cuda_emulation.h -DFLS_CUDA_EMULATION, see setup_emulation.py): the very
// sources nvcc compiles, no #ifdef per kernel. What it provides is what our kernels use: the thread/block
// coordinates, warps of 32 lanes with their shuffles, votes and masks, __syncthreads/__syncwarp, shared
// memory (through the FLS_SHARED / FLS_DYNAMIC_SHARED spellings of csrc/cuda/shared_memory.cuh), the
// fast-math intrinsics and bit casts, device asserts, and the runtime's error and stream functions.
// __half and __nv_bfloat16 come from CUDA's own headers, which compile for the host.
//
// Each CUDA thread of a block runs on its own fiber (own stack); the threads switch only at barriers,
// warp operations and exits (scheduler.cpp), so a kernel that reads shared memory before the barrier that
// should order it reads what is there (poison or another block's data), as on a GPU, not the right value.
#pragma once

#ifndef FLS_CUDA_EMULATION
#error "cuda_emulation.h is for the emulated build only (-DFLS_CUDA_EMULATION)"
#endif

// A device assert is glibc's __assert_fail on the host; the emulator's own fails the launch instead of the
// process. Renamed before any header declares it.
#define __assert_fail fls_emu_assert_fail

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <type_traits>

#undef __launch_bounds__
#define __launch_bounds__(...)
#undef __noinline__
#define __noinline__ __attribute__((noinline))
// Every shared array goes through csrc/cuda/shared_memory.cuh, which the emulator backs per block.
#undef __shared__
#define __shared__ static_assert(false, "declare shared memory with FLS_SHARED / FLS_DYNAMIC_SHARED");

extern "C" [[noreturn]] void fls_emu_assert_fail(const char* assertion, const char* file, unsigned int line,
                                                 const char* function) noexcept;

namespace fls_emu {

// The coordinates of the CUDA thread that runs now (the scheduler sets them before it resumes a thread).
extern uint3 thread_idx, block_idx;
extern dim3 block_dim, grid_dim;

enum class WarpOp : int { kSync, kShflIdx, kShflXor, kShflDown, kShflUp, kBallot, kAll, kAny, kActiveMask };

// Parks the calling thread until every lane of `mask` (lanes of its warp) reached a warp operation of the
// same kind and mask, then returns this lane's result (for shuffles the bits of the source lane's `bits`;
// for votes the ballot). Mismatched masks, a lane outside its own mask, a lane that does not exist or has
// exited: the launch fails with an error naming the kernel and the lanes.
// `file`/`line` is the operation's call site (synccheck: the lanes of one operation call it from one site).
uint64_t warp_op(WarpOp op, unsigned mask, uint64_t bits, int arg, int width, const char* file, int line);
// __syncthreads: parks until every thread of the block is here (one that exited instead is an error, and so
// are threads waiting at barriers of different call sites: synccheck).
void sync_block(const char* file, int line);
// The storage of the shared array declared at `site` (one per declaration and template instance) for the
// block that runs now: exactly `bytes` between unowned redzones, poisoned (0xff bytes: NaN floats) when the
// block starts.
void* static_shared(const void* site, size_t bytes, size_t align, const char* name);
// The block's dynamic shared memory: exactly the bytes the launch requested, poisoned.
void* dynamic_shared();

// Runs `body` (the kernel call) for every thread of the grid; returns the launch's status as CUDA would.
cudaError_t launch(const char* kernel, dim3 grid, dim3 block, size_t dynamic_smem, void (*body)(void*),
                   void* ctx);

template <typename T>
inline uint64_t to_bits(T v) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "warp operations move at most 8 bytes");
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof(T));
  return b;
}
template <typename T>
inline T from_bits(uint64_t b) {
  T v;
  std::memcpy(&v, &b, sizeof(T));
  return v;
}

}  // namespace fls_emu

#define threadIdx (::fls_emu::thread_idx)
#define blockIdx (::fls_emu::block_idx)
#define blockDim (::fls_emu::block_dim)
#define gridDim (::fls_emu::grid_dim)
#define warpSize 32

// The barrier and warp operations take their call site as default arguments (the caller's file and line).
#define FLS_EMU_SITE const char *file = __builtin_FILE(), int line = __builtin_LINE()
inline void __syncthreads(FLS_EMU_SITE) { ::fls_emu::sync_block(file, line); }
inline void __syncwarp(unsigned mask = 0xffffffffu, FLS_EMU_SITE) {
  ::fls_emu::warp_op(::fls_emu::WarpOp::kSync, mask, 0, 0, 32, file, line);
}
inline unsigned __activemask(FLS_EMU_SITE) {
  return static_cast<unsigned>(::fls_emu::warp_op(::fls_emu::WarpOp::kActiveMask, 0, 0, 0, 32, file, line));
}
inline unsigned __ballot_sync(unsigned mask, int pred, FLS_EMU_SITE) {
  return static_cast<unsigned>(::fls_emu::warp_op(::fls_emu::WarpOp::kBallot, mask, pred != 0, 0, 32, file, line));
}
inline int __all_sync(unsigned mask, int pred, FLS_EMU_SITE) {
  return static_cast<int>(::fls_emu::warp_op(::fls_emu::WarpOp::kAll, mask, pred != 0, 0, 32, file, line));
}
inline int __any_sync(unsigned mask, int pred, FLS_EMU_SITE) {
  return static_cast<int>(::fls_emu::warp_op(::fls_emu::WarpOp::kAny, mask, pred != 0, 0, 32, file, line));
}
template <typename T>
inline T __shfl_sync(unsigned mask, T var, int src_lane, int width = 32, FLS_EMU_SITE) {
  return ::fls_emu::from_bits<T>(::fls_emu::warp_op(::fls_emu::WarpOp::kShflIdx, mask, ::fls_emu::to_bits(var),
                                                    src_lane, width, file, line));
}
template <typename T>
inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32, FLS_EMU_SITE) {
  return ::fls_emu::from_bits<T>(::fls_emu::warp_op(::fls_emu::WarpOp::kShflXor, mask, ::fls_emu::to_bits(var),
                                                    lane_mask, width, file, line));
}
template <typename T>
inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32, FLS_EMU_SITE) {
  return ::fls_emu::from_bits<T>(::fls_emu::warp_op(::fls_emu::WarpOp::kShflDown, mask, ::fls_emu::to_bits(var),
                                                    static_cast<int>(delta), width, file, line));
}
template <typename T>
inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32, FLS_EMU_SITE) {
  return ::fls_emu::from_bits<T>(::fls_emu::warp_op(::fls_emu::WarpOp::kShflUp, mask, ::fls_emu::to_bits(var),
                                                    static_cast<int>(delta), width, file, line));
}

// Atomics: the threads of a launch never run at the same time, so a load and a store make a read-modify-write
// atomic; they are the __atomic builtins so that the checked build observes them as atomic (observe.h).
template <typename T>
inline T fls_emu_atomic_update(T* p, T (*f)(T, T), T v) {
  T old, next;
  __atomic_load(p, &old, __ATOMIC_RELAXED);
  next = f(old, v);
  __atomic_store(p, &next, __ATOMIC_RELAXED);
  return old;
}
template <typename T>
inline T atomicAdd(T* p, T v) {
  return fls_emu_atomic_update<T>(p, [](T a, T b) -> T { return a + b; }, v);
}
template <typename T>
inline T atomicMax(T* p, T v) {
  return fls_emu_atomic_update<T>(p, [](T a, T b) -> T { return a < b ? b : a; }, v);
}
template <typename T>
inline T atomicExch(T* p, T v) {
  return fls_emu_atomic_update<T>(p, [](T, T b) -> T { return b; }, v);
}
template <typename T>
inline T atomicCAS(T* p, T compare, T v) {
  T old;
  __atomic_load(p, &old, __ATOMIC_RELAXED);
  if (old == compare) __atomic_store(p, &v, __ATOMIC_RELAXED);
  return old;
}

// Fast-math intrinsics: the host's correctly rounded functions (the GPU's differ in the last bits, within
// the tests' tolerances).
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return std::sqrt(x); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __saturatef(float x) { return x < 0.f ? 0.f : (x > 1.f ? 1.f : x); }
inline unsigned __float_as_uint(float x) { return ::fls_emu::from_bits<unsigned>(::fls_emu::to_bits(x)); }
inline float __uint_as_float(unsigned x) { return ::fls_emu::from_bits<float>(::fls_emu::to_bits(x)); }
inline int __float_as_int(float x) { return ::fls_emu::from_bits<int>(::fls_emu::to_bits(x)); }
inline float __int_as_float(int x) { return ::fls_emu::from_bits<float>(::fls_emu::to_bits(x)); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
template <typename T>
inline T __ldg(const T* p) {
  return *p;
}
