// ATen-side helpers shared by the op wrappers in csrc/ops/: argument checks with messages that
// name the argument and the limit, DType mapping, dropout parameters, CUDA launch checks.
#pragma once
#include <ATen/ATen.h>
#include <torch/library.h>

#include <string>

#include "fls/common.h"

#ifdef FLS_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace fls {

inline DType to_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return DType::kFloat32;
    case at::kDouble: return DType::kFloat64;
    case at::kHalf: return DType::kFloat16;
    case at::kBFloat16: return DType::kBFloat16;
    default: TORCH_CHECK(false, "fairseq_lightseq: unsupported dtype ", t);
  }
}

// Floating dtypes a kernel accepts on the tensor's device: CPU float32/float64/bfloat16,
// CUDA float32/float16/bfloat16.
inline void check_float(const at::Tensor& t, const char* name) {
  const auto s = t.scalar_type();
  if (t.is_cuda()) {
    TORCH_CHECK(s == at::kFloat || s == at::kHalf || s == at::kBFloat16, name,
                " must be float32, float16 or bfloat16 on CUDA, got ", s);
  } else {
    TORCH_CHECK(t.device().is_cpu(), name, " must be on CPU or CUDA, got ", t.device());
    TORCH_CHECK(s == at::kFloat || s == at::kDouble || s == at::kBFloat16, name,
                " must be float32, float64 or bfloat16 on CPU, got ", s);
  }
}

inline void check_same(const at::Tensor& t, const at::Tensor& ref, const char* name, const char* ref_name) {
  TORCH_CHECK(t.device() == ref.device(), name, " is on ", t.device(), " but ", ref_name, " is on ", ref.device());
  TORCH_CHECK(t.scalar_type() == ref.scalar_type(), name, " has dtype ", t.scalar_type(), " but ", ref_name,
              " has dtype ", ref.scalar_type());
}

inline void check_shape(const at::Tensor& t, at::IntArrayRef expected, const char* name) {
  TORCH_CHECK(t.sizes() == expected, name, " must have shape ", expected, ", got ", t.sizes());
}

// Dropout parameters for a draw with probability p (0 <= p <= 1) at (seed, offset) of the stream.
inline DropoutParams make_dropout(double p, int64_t seed, int64_t offset) {
  TORCH_CHECK(p >= 0.0 && p <= 1.0, "dropout p must be in [0, 1], got ", p);
  TORCH_CHECK(offset >= 0, "dropout offset must be >= 0, got ", offset);
  DropoutParams d;
  d.seed = static_cast<uint64_t>(seed);
  d.offset = static_cast<uint64_t>(offset);
  d.threshold = static_cast<uint32_t>(p * 16777216.0);  // floor(p * 2^24), exact for p in [0, 1]
  d.scale = p >= 1.0 ? 0.0f : static_cast<float>(1.0 / (1.0 - p));
  return d;
}

#ifdef FLS_WITH_CUDA
inline void* current_stream(const at::Tensor& t) {
  return static_cast<void*>(at::cuda::getCurrentCUDAStream(t.device().index()).stream());
}
// CUDA launchers return an int cudaError_t (0 = success) so that their headers stay free of CUDA.
#define FLS_CHECK_LAUNCH(expr)                                                          \
  do {                                                                                  \
    int fls_err_ = (expr);                                                              \
    TORCH_CHECK(fls_err_ == 0, "fairseq_lightseq CUDA kernel failed: ", #expr,          \
                " returned cudaError ", fls_err_, " (", ::fls::cuda_error_string(fls_err_), ")"); \
  } while (0)
const char* cuda_error_string(int err);
#endif

}  // namespace fls
