// Kernels for the emulated device's sanitizer checks (csrc/emulation/checks.cpp and the scheduler's
// synccheck), compiled into the emulated libraries only (Makefile: EMU_SRCS): for each check one kernel with
// the hazard, which must fail its launch naming the check, and one correct kernel beside it, which must not.
// tests/ops/test_cuda_emulation_checks.py runs them. Not part of any real build.
#include "../../csrc/cuda/launch.cuh"
#include "../../csrc/cuda/shared_memory.cuh"

namespace {

// racecheck, across warps: thread 63 overwrites a cell that thread 0 reads in the same barrier interval.
template <bool kBarrier>
__global__ void cross_warp_kernel(float* out) {
  FLS_SHARED(float, cell, [1]);
  if (threadIdx.x == 0) cell[0] = 1.f;
  __syncthreads();
  if (threadIdx.x == 0) out[0] = cell[0];
  if (kBarrier) __syncthreads();
  if (threadIdx.x == 63) cell[0] = 2.f;
}

// racecheck, write-after-write: threads 0 and 32 write one cell in one interval (or the second waits).
template <bool kBarrier>
__global__ void double_write_kernel(float* out) {
  FLS_SHARED(float, cell, [1]);
  if (threadIdx.x == 0) cell[0] = 1.f;
  if (kBarrier) __syncthreads();
  if (threadIdx.x == 32) cell[0] = 2.f;
  __syncthreads();
  if (threadIdx.x == 0) out[0] = cell[0];
}

// racecheck, within a warp: lane 1 reads what lane 0 wrote, after a shuffle (orders no memory) or after a
// __syncwarp (orders it).
template <bool kSyncwarp>
__global__ void lanes_kernel(float* out) {
  FLS_SHARED(float, cell, [1]);
  float v = threadIdx.x;
  if (threadIdx.x == 0) cell[0] = 5.f;
  if (kSyncwarp) __syncwarp();
  else v = __shfl_xor_sync(0xffffffffu, v, 1);
  if (threadIdx.x == 1) out[0] = cell[0] + v - v;
}

// Global race: block 1 reads the element block 0 writes, in the same launch (or its own element).
template <bool kOwn>
__global__ void blocks_kernel(float* out) {
  if (threadIdx.x != 0) return;
  out[blockIdx.x] = 1.f;
  out[8 + blockIdx.x] = out[kOwn ? blockIdx.x : 0];
}

// initcheck: the max over all 32 scratch slots, of which two warps wrote two (or over the written ones).
template <bool kWrittenOnly>
__global__ void scratch_kernel(float* out) {
  FLS_SHARED(float, scratch, [32]);
  const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  if (lane == 0) scratch[warp] = float(warp);
  __syncthreads();
  float v = -1.f;
  if (threadIdx.x == 0)
    for (unsigned w = 0; w < (kWrittenOnly ? nwarps : 32u); ++w) v = fmaxf(v, scratch[w]);
  if (threadIdx.x == 0) out[0] = v;
}

// synccheck: __syncthreads in both branches of an if (or one barrier after it).
template <bool kOneBarrier>
__global__ void branch_barrier_kernel(float* out) {
  if (kOneBarrier) {
    if (threadIdx.x < 16) out[threadIdx.x] = 1.f;
    __syncthreads();
  } else if (threadIdx.x < 16) {
    out[threadIdx.x] = 1.f;
    __syncthreads();
  } else {
    __syncthreads();
  }
}

// synccheck: the lanes of one shuffle call it from two sites (or from one).
template <bool kOneSite>
__global__ void branch_shuffle_kernel(float* out) {
  float v = threadIdx.x;
  if (kOneSite || threadIdx.x < 16) v = __shfl_xor_sync(0xffffffffu, v, 1);
  else v = __shfl_xor_sync(0xffffffffu, v, 1);
  out[threadIdx.x] = v;
}

// Bounds: thread 0 writes one element past a static shared array (or its last element).
template <int kIndex>
__global__ void past_end_kernel(float* out) {
  FLS_SHARED(float, row, [32]);
  row[threadIdx.x] = 1.f;
  __syncthreads();
  if (threadIdx.x == 0) row[kIndex] = 2.f;
  __syncthreads();
  out[threadIdx.x] = row[threadIdx.x];
}

// 32 KiB of static shared memory: with 16 KiB of dynamic it is the limit, with more it is over.
__global__ void big_shared_kernel(float* out) {
  FLS_SHARED(float, big, [8192]);
  FLS_DYNAMIC_SHARED(float, dyn);
  big[threadIdx.x] = 1.f;
  dyn[threadIdx.x] = 2.f;
  out[threadIdx.x] = big[threadIdx.x] + dyn[threadIdx.x];
}

}  // namespace

// Launches check kernel `which` (even: the hazard, odd: its correct twin) and returns the launch's status;
// `out` has >= 64 floats.
extern "C" int fls_emu_check_case(int which, float* out) {
  using fls::cuda::launch;
  switch (which) {
    case 0: launch<cross_warp_kernel<false>>(1, 64, 0, nullptr, out); break;
    case 1: launch<cross_warp_kernel<true>>(1, 64, 0, nullptr, out); break;
    case 2: launch<double_write_kernel<false>>(1, 64, 0, nullptr, out); break;
    case 3: launch<double_write_kernel<true>>(1, 64, 0, nullptr, out); break;
    case 4: launch<lanes_kernel<false>>(1, 32, 0, nullptr, out); break;
    case 5: launch<lanes_kernel<true>>(1, 32, 0, nullptr, out); break;
    case 6: launch<blocks_kernel<false>>(2, 32, 0, nullptr, out); break;
    case 7: launch<blocks_kernel<true>>(2, 32, 0, nullptr, out); break;
    case 8: launch<scratch_kernel<false>>(1, 64, 0, nullptr, out); break;
    case 9: launch<scratch_kernel<true>>(1, 64, 0, nullptr, out); break;
    case 10: launch<branch_barrier_kernel<false>>(1, 32, 0, nullptr, out); break;
    case 11: launch<branch_barrier_kernel<true>>(1, 32, 0, nullptr, out); break;
    case 12: launch<branch_shuffle_kernel<false>>(1, 32, 0, nullptr, out); break;
    case 13: launch<branch_shuffle_kernel<true>>(1, 32, 0, nullptr, out); break;
    case 14: launch<past_end_kernel<32>>(1, 32, 0, nullptr, out); break;
    case 15: launch<past_end_kernel<31>>(1, 32, 0, nullptr, out); break;
    case 16: launch<big_shared_kernel>(1, 32, 16 * 1024 + 4, nullptr, out); break;
    case 17: launch<big_shared_kernel>(1, 32, 16 * 1024, nullptr, out); break;
    default: return -1;
  }
  return static_cast<int>(cudaGetLastError());
}
