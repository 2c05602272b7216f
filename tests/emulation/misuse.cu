// Kernels that misuse CUDA on purpose, compiled into the emulated library only (Makefile: EMU_SRCS), so that
// tests/ops/test_cuda_emulation.py can check that the emulator fails each launch as CUDA would or with an
// error naming the kernel, instead of hanging or passing. Not part of any real build.
#include "../../csrc/cuda/launch.cuh"
#include "../../csrc/cuda/shared_memory.cuh"

namespace {

__global__ void empty_kernel() {}

__global__ void divergent_barrier_kernel() {
  if (threadIdx.x < 16) __syncthreads();  // half the block never reaches the barrier
}

__global__ void shuffle_without_caller_kernel(float* out) {
  out[threadIdx.x] = __shfl_sync(0x0000fffeu, 1.f, 0);  // lane 0 calls with a mask that leaves it out
}

__global__ void shuffle_from_inactive_lane_kernel(float* out) {
  if (threadIdx.x < 16) out[threadIdx.x] = __shfl_sync(0x0000ffffu, float(threadIdx.x), 20);  // lane 20 is not in
}

__global__ void missing_lane_kernel(float* out) {
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.f, 1);  // launched with 8 threads: lanes 8-31 do not exist
}

__global__ void big_static_shared_kernel(float* out) {
  FLS_SHARED(float, big, [13000]);  // 52,000 bytes > 48 KiB
  big[threadIdx.x] = 1.f;
  out[threadIdx.x] = big[threadIdx.x];
}

__global__ void assert_kernel() {
  if (blockIdx.x == 1 && threadIdx.x == 3) __assert_fail("deliberate", __FILE__, __LINE__, "assert_kernel");
}

// Stale shared memory: thread 0 reads what thread 31 (another warp when blockDim.x > 32) writes, without a
// barrier; returns what it read.
__global__ void missing_barrier_kernel(float* out) {
  FLS_SHARED(float, cell, [1]);
  if (threadIdx.x == blockDim.x - 1) cell[0] = 42.f;
  if (threadIdx.x == 0) out[0] = cell[0];
}

}  // namespace

// Launches misuse number `which` and returns the launch's status (cudaGetLastError); `out` has >= 64 floats.
extern "C" int fls_emu_misuse(int which, float* out) {
  using fls::cuda::launch;
  switch (which) {
    case 0: launch<empty_kernel>(1, 1025, 0, nullptr); break;
    case 1: launch<empty_kernel>(dim3(1, 65536), 32, 0, nullptr); break;
    case 2: launch<empty_kernel>(1, 32, 48 * 1024 + 4, nullptr); break;
    case 3: launch<big_static_shared_kernel>(1, 32, 0, nullptr, out); break;
    case 4: launch<divergent_barrier_kernel>(1, 32, 0, nullptr); break;
    case 5: launch<shuffle_without_caller_kernel>(1, 32, 0, nullptr, out); break;
    case 6: launch<shuffle_from_inactive_lane_kernel>(1, 32, 0, nullptr, out); break;
    case 7: launch<missing_lane_kernel>(1, 8, 0, nullptr, out); break;
    case 8: launch<assert_kernel>(2, 32, 0, nullptr); break;
    case 9: launch<missing_barrier_kernel>(1, 64, 0, nullptr, out); break;
    case 10: launch<empty_kernel>(dim3(2, 3, 4), dim3(8, 4, 2), 0, nullptr); break;
    default: return -1;
  }
  return static_cast<int>(cudaGetLastError());
}

// The message of the last error, as the op layer shows it.
extern "C" const char* fls_emu_error_string(int error) { return cudaGetErrorString(static_cast<cudaError_t>(error)); }
