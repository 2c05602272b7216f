// Label-smoothed cross entropy forward/backward: one block per row, any V (strided loops). The
// forward is a single pass over the row with per-thread online max / exp-sum / (max - z) sums,
// merged across the block; the backward recomputes p_v = exp(z_v - lse) from the saved lse.
#include <cstdio>

#include "../kernels/cross_entropy.h"
#include "device_assert.cuh"
#include "dtype.cuh"
#include "fls/label_smoothing.h"
#include "launch.cuh"
#include "reduce.cuh"
#include "shared_memory.cuh"

namespace fls {
namespace cuda {
namespace {

constexpr int kThreads = 256;

// A target outside [0, V) that is not ignore_index: printed once per row (thread 0), then a device assert.
// Checked here rather than on the host, where it would cost a device sync per call. Called by every thread of
// the block (the target is the block's): the barrier keeps any thread from failing the launch before thread 0
// has printed the line the assert refers to. Not inlined and noreturn: the kernel keeps no registers live
// across this cold call.
[[noreturn]] __device__ __noinline__ void report_bad_target(int64_t row, int64_t t, int64_t V, int64_t ignore_index) {
  if (threadIdx.x == 0) {
    printf("label_smoothed_cross_entropy: target[%lld] = %lld is out of range for V = %lld classes "
           "(must be in [0, %lld) or equal ignore_index = %lld)\n",
           static_cast<long long>(row), static_cast<long long>(t), static_cast<long long>(V),
           static_cast<long long>(V), static_cast<long long>(ignore_index));
  }
  __syncthreads();
  __assert_fail("label_smoothed_cross_entropy: target out of range (see the line above)", __FILE__, __LINE__,
                "report_bad_target");
}

template <typename T>
__global__ void __launch_bounds__(kThreads) ls_xent_fwd_kernel(const T* __restrict__ logits,
                                                               const int64_t* __restrict__ target,
                                                               float* __restrict__ loss, float* __restrict__ nll,
                                                               float* __restrict__ lse, int64_t V, LsCoef<float> c,
                                                               int64_t ignore_index) {
  FLS_SHARED(float, scratch, [32]);
  const int64_t row = blockIdx.x;
  const int64_t t = target[row];
  if (t == ignore_index) {  // uniform over the block: no thread reaches a barrier
    if (threadIdx.x == 0) loss[row] = nll[row] = lse[row] = 0.f;
    return;
  }
  if (t < 0 || t >= V) report_bad_target(row, t, V, ignore_index);  // uniform over the block
  const T* z = logits + row * V;
  // Per-thread running max m, s = sum exp(z - m), d = sum (m - z), over the cnt finite elements. A -inf logit
  // adds exp(-inf) = 0 to s and +inf to d (as on the CPU) outside the running update, where it would make
  // exp(-inf - -inf) = NaN.
  float m = -INFINITY, s = 0.f, d = 0.f, cnt = 0.f;
  bool neg_inf = false;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    const float x = to_float(z[v]);
    if (x == -INFINITY) {
      neg_inf = true;
      continue;
    }
    if (cnt == 0.f) {
      m = x;
      s = 1.f;
    } else if (x > m) {
      s = s * __expf(m - x) + 1.f;
      d += cnt * (x - m);
      m = x;
    } else {
      s += __expf(x - m);
      d += m - x;
    }
    cnt += 1.f;
  }
  const float M = block_max(m, scratch);
  // Threads without finite elements (V < blockDim.x) contribute nothing (avoids 0 * inf).
  const float s_part = cnt > 0.f ? s * __expf(m - M) : 0.f;
  const float d_part = (cnt > 0.f ? d + cnt * (M - m) : 0.f) + (neg_inf ? INFINITY : 0.f);
  const float S = block_sum(s_part, scratch);
  const float D = block_sum(d_part, scratch);
  if (threadIdx.x == 0) {
    const float log_s = logf(S);
    float l, n;
    ls_row_loss<float>(c, log_s, D, M, to_float(z[t]), &l, &n);
    loss[row] = l;
    nll[row] = n;
    lse[row] = M + log_s;
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) ls_xent_bwd_kernel(const float* __restrict__ dloss,
                                                               const float* __restrict__ dnll, const T* logits,
                                                               const int64_t* __restrict__ target,
                                                               const float* __restrict__ lse, T* dlogits, int64_t V,
                                                               LsCoef<float> c, int64_t ignore_index) {
  // logits and dlogits may alias: no __restrict__; every element is read and then written by
  // the same thread.
  const int64_t row = blockIdx.x;
  const int64_t t = target[row];
  T* g = dlogits + row * V;
  if (t == ignore_index) {
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) g[v] = from_float<T>(0.f);
    return;
  }
  const T* z = logits + row * V;
  const float l = lse[row];
  const LsGradCoef<float> gc = ls_grad_coef<float>(c, dloss[row], dnll[row]);
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    const float p = __expf(to_float(z[v]) - l);
    const float r = ls_grad<float>(gc, p) - (v == t ? gc.c_t : 0.f);
    g[v] = from_float<T>(r);
  }
}

}  // namespace

int ls_cross_entropy_fwd(const LsCrossEntropyFwdParams& p, void* stream) {
  if (p.rows == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  const LsCoef<float> c = ls_coef<float>(p.epsilon, p.V);
  FLS_CUDA_DISPATCH(p.dtype, launch<ls_xent_fwd_kernel<scalar_t>>(static_cast<unsigned>(p.rows), kThreads, 0, s,
                                 static_cast<const scalar_t*>(p.logits), p.target, static_cast<float*>(p.loss),
                                 static_cast<float*>(p.nll), static_cast<float*>(p.lse), p.V, c, p.ignore_index));
  FLS_CUDA_RETURN_LAST_ERROR();
}

int ls_cross_entropy_bwd(const LsCrossEntropyBwdParams& p, void* stream) {
  if (p.rows == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  const LsCoef<float> c = ls_coef<float>(p.epsilon, p.V);
  FLS_CUDA_DISPATCH(p.dtype, launch<ls_xent_bwd_kernel<scalar_t>>(static_cast<unsigned>(p.rows), kThreads, 0, s,
                                 static_cast<const float*>(p.dloss), static_cast<const float*>(p.dnll),
                                 static_cast<const scalar_t*>(p.logits), p.target, static_cast<const float*>(p.lse),
                                 static_cast<scalar_t*>(p.dlogits), p.V, c, p.ignore_index));
  FLS_CUDA_RETURN_LAST_ERROR();
}

}  // namespace cuda
}  // namespace fls
