// How every kernel interface (csrc/kernels/<family>.h) declares its CUDA launchers. Plain C++, no CUDA.
//
// A launcher is defined in csrc/cuda/<family>.cu, which only a CUDA build compiles, and called by the
// family's CUDA implementation in csrc/ops/<family>.cpp, which every build compiles and only a CUDA build
// registers. FLS_CUDA_LAUNCHER declares the launchers weak: a CPU-only build then links and loads without
// their definitions (their addresses are null, and no registered kernel reaches them), and the op layer
// calls them without any #ifdef. Weak symbols are an ELF (Linux) feature, like the rest of this build.
#pragma once

#define FLS_CUDA_LAUNCHER __attribute__((weak))

namespace fls {
namespace cuda {

// The message of a launcher's return code (a cudaError_t as int), from cudaGetErrorString
// (csrc/cuda/error_string.cu): the op layer includes no CUDA header.
FLS_CUDA_LAUNCHER const char* error_string(int error);
// Takes (returns and clears) the error pending from earlier work, as cudaGetLastError does.
FLS_CUDA_LAUNCHER int take_last_error();
// Defined only by the emulated library (csrc/emulation/): whether it is loaded.
FLS_CUDA_LAUNCHER bool emulated_device();

}  // namespace cuda
}  // namespace fls
