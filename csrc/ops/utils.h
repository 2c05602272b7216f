// ATen-side helpers shared by the op layer (csrc/ops/<family>.cpp): argument checks with messages that
// name the argument and the limit, DType mapping, dropout parameters.
#pragma once
#include <ATen/ATen.h>
#include <torch/library.h>

#include <atomic>
#include <string>

#include "fls/common.h"

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

// The emulated CUDA device (csrc/emulation/, a test build): while it is on, the CPU registrations run each
// op's CUDA implementation on CPU tensors, whose launchers the emulated library (loaded before this one, see
// fairseq_lightseq/ops/_backend.py) provides. Off in every normal run; csrc/module.cpp switches it.
inline std::atomic<bool> g_cuda_emulation{false};
inline bool cuda_emulation_on() { return g_cuda_emulation.load(std::memory_order_relaxed); }

// Whether t's op runs the CUDA implementation: a CUDA tensor, or a CPU tensor on the emulated device.
inline bool runs_cuda(const at::Tensor& t) { return t.is_cuda() || (t.is_cpu() && cuda_emulation_on()); }

// Floating dtypes a kernel accepts on the tensor's device: CPU float32/float64/bfloat16,
// CUDA float32/float16/bfloat16.
inline void check_float(const at::Tensor& t, const char* name) {
  const auto s = t.scalar_type();
  if (runs_cuda(t)) {
    TORCH_CHECK(s == at::kFloat || s == at::kHalf || s == at::kBFloat16, name,
                " must be float32, float16 or bfloat16 on CUDA, got ", s);
  } else {
    TORCH_CHECK(t.device().is_cpu(), name, " must be on CPU or CUDA, got ", t.device());
    TORCH_CHECK(s == at::kFloat || s == at::kDouble || s == at::kBFloat16, name,
                " must be float32, float64 or bfloat16 on CPU, got ", s);
  }
}

// Accumulation dtype of statistics (mean, rstd, lse, ...) kept for x: float64 for float64, else float32.
inline at::ScalarType acc_type(const at::Tensor& x) { return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat; }

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

// The row map of a token-wise op's draw (Python's dropout_stream.Dropout.rows): none, or int64 [count] on
// ref's device, for an input of `count` rows of `cols`. Returned contiguous; undefined when there is none,
// the draw is off or the input empty (the kernels then take their identity path).
inline at::Tensor dropout_rows(const c10::optional<at::Tensor>& rows, int64_t count, int64_t cols,
                               const DropoutParams& d, const at::Tensor& ref, const char* op) {
  if (!rows.has_value() || !rows->defined()) return at::Tensor();
  TORCH_CHECK(rows->scalar_type() == at::kLong && rows->dim() == 1, op,
              ": dropout rows must be a 1-D int64 tensor, got ", rows->scalar_type(), " of shape ", rows->sizes());
  TORCH_CHECK(rows->device() == ref.device(), op, ": dropout rows are on ", rows->device(), " but the input is on ",
              ref.device());
  TORCH_CHECK(rows->numel() == count, op, ": dropout rows: ", rows->numel(), " rows for an input of ", count,
              " rows of ", cols);
  if (d.threshold == 0 || count == 0 || cols == 0) return at::Tensor();
  return rows->contiguous();
}

inline const int64_t* rows_ptr(const at::Tensor& rows) { return rows.defined() ? rows.data_ptr<int64_t>() : nullptr; }

}  // namespace fls
