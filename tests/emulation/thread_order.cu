// A correct kernel that records the order in which the emulator ran its threads, compiled into the emulated
// library only (Makefile: EMU_SRCS), so that tests/ops/test_cuda_emulation.py can check the schedules: index
// order, or a random order drawn afresh for every launch. Not part of any real build.
#include "../../csrc/cuda/launch.cuh"

namespace {

// Each thread takes the next ticket: out[t] is the rank of thread t in the order the threads ran. Threads run
// to their end without parking (no barrier, no warp operation), so the ranks are the schedule's order.
__global__ void ticket_kernel(int* counter, int* out) { out[threadIdx.x] = atomicAdd(counter, 1); }

}  // namespace

// Launches ticket_kernel on one block of `threads` (at most 1024) and returns the launch's status; `out` has
// `threads` ints.
extern "C" int fls_emu_thread_order(int threads, int* out) {
  int counter = 0;
  fls::cuda::launch<ticket_kernel>(1, threads, 0, nullptr, &counter, out);
  return static_cast<int>(cudaGetLastError());
}
