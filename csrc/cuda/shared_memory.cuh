// The one spelling of shared memory in the kernels, for nvcc and for the emulated build alike.
//   FLS_SHARED(float, scratch, [32]);      // __shared__ float scratch[32];
//   FLS_DYNAMIC_SHARED(float, smem);       // extern __shared__ float smem[];  (the launch's dynamic bytes)
// Both are 16-byte aligned (vector loads). In the emulated build (csrc/emulation/) an array is the block's
// storage that the emulator keeps per declaration and block and poisons when a block starts, so a read
// before the write that a barrier should have ordered sees garbage, as on a GPU.
#pragma once

#ifdef FLS_CUDA_EMULATION
#define FLS_SHARED(T, name, dims)                                                                            \
  static const char name##_fls_site = 0;                                                                     \
  using name##_fls_type = T dims;                                                                            \
  name##_fls_type& name = *static_cast<name##_fls_type*>(                                                    \
      ::fls_emu::static_shared(&name##_fls_site, sizeof(name##_fls_type), 16, #name))
#define FLS_DYNAMIC_SHARED(T, name) T* const name = static_cast<T*>(::fls_emu::dynamic_shared())
#else
#define FLS_SHARED(T, name, dims) __shared__ __align__(16) T name dims
#define FLS_DYNAMIC_SHARED(T, name) extern __shared__ __align__(16) T name[]
#endif
