// A device-side assert for bad input that a host check could only find after a device->host copy (a stream
// sync per call): the kernel prints what is wrong and stops with a device assert, as PyTorch's
// CUDA_KERNEL_ASSERT_PRINTF does; the next CUDA call of the process then reports the error.
#pragma once

// glibc's __assert_fail, which CUDA also provides on the device. <assert.h> declares it only without NDEBUG,
// so it is declared here the way glibc does (the same declaration as torch/headeronly/macros/Macros.h).
extern "C" {
#if defined(__CUDA_ARCH__)
__host__ __device__
#endif
    void
    __assert_fail(const char* assertion, const char* file, unsigned int line, const char* function) noexcept
    __attribute__((__noreturn__));
}
