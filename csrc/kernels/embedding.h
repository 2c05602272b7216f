// Kernel interface of the embedding family: the params the op layer fills (csrc/ops/embedding.cpp) and the
// entry point of each device (csrc/cpu/embedding.cpp, csrc/cuda/embedding.cu). Plain C++, included by the
// CUDA file.
#pragma once
#include <cstdint>

#include "fls/common.h"
#include "cuda_launcher.h"

namespace fls {

// out[r, :] = dropout(scale * weight[tokens[r], :] + pos_weight[positions[r], :]) for the n = B*T rows r,
// zeros where tokens[r] == padding_idx; dropout element index r * dim + c (flat index into [B, T, E]), or with
// a row map (row_map non-null, int64 [n]: packed tokens of a padded batch) row_map[r] * dim + c. The map only
// names stream elements (no memory is indexed by it); null is the identity.
// tokens, positions: [n] int64 (positions unused when pos_weight is null); weight: [num_embeddings, dim]
// dtype; pos_weight: [num_positions, dim] dtype or null; out: [n, dim] dtype.
// Ids outside their table: the CPU op layer checks them before the kernel runs; on CUDA the kernel checks
// every id (no host sync) and prints "embedding: token id <id> exceeds num_embeddings <limit> ..." (or
// "position ... max positions ...", "... is negative"), then fails a device assert, so the next CUDA call
// of the process fails.
struct EmbeddingFwdParams {
  DType dtype;
  const int64_t* tokens;
  const int64_t* positions;
  const void* weight;
  const void* pos_weight;
  void* out;
  int64_t n, dim, num_embeddings, num_positions, padding_idx;
  double scale;
  DropoutParams drop;
  const int64_t* row_map = nullptr;  // [n] or null
};

// Gradient of one table looked up by `keys` (tokens for dweight with mult = scale, positions for
// dpos_weight with mult = 1): out[k, :] = mult * sum over rows r with keys[r] == k and tokens[r] !=
// padding_idx, in increasing r, of grad[r, :] * dropout factor of element r * dim + c (row_map[r] * dim + c
// with a row map, as the forward's) (deterministic: a
// fixed order, no atomics). grad: [n, dim] dtype; keys, tokens: [n] int64; out: [num_rows, dim] dtype,
// rows no key names are zero.
struct EmbeddingTableGradParams {
  DType dtype;
  const void* grad;
  const int64_t* keys;
  const int64_t* tokens;
  void* out;
  int64_t n, dim, num_rows, padding_idx;
  bool keys_are_positions;  // picks the wording of a bad-id message
  double mult;
  DropoutParams drop;
  const int64_t* row_map = nullptr;  // [n] or null
};

// The CPU kernel sorts the keys itself (stable) and writes every row of out (it may be uninitialised).
namespace cpu {
void embedding_fwd(const EmbeddingFwdParams& p);
void embedding_table_grad(const EmbeddingTableGradParams& p);
}  // namespace cpu

// CUDA launchers return a cudaError_t as int (0 = ok).
namespace cuda {
FLS_CUDA_LAUNCHER int embedding_fwd(const EmbeddingFwdParams& p, void* stream);

// Key that marks a row giving no gradient (a pad token) in embedding_table_grad's sorted keys.
constexpr int64_t kNoGradKey = INT64_MAX;

// The CUDA kernel takes the keys already grouped, by a STABLE ascending sort on the device (the op layer
// does it with ATen, no host sync): sorted_keys, order: [n] int64 (order[i] = row of the i-th key), pad rows
// keyed kNoGradKey (skipped). It writes only the rows it sums: out must be zero-filled. p.keys and p.tokens
// are not read.
FLS_CUDA_LAUNCHER int embedding_table_grad(const EmbeddingTableGradParams& p, const int64_t* sorted_keys,
                                           const int64_t* order, void* stream);
}  // namespace cuda

}  // namespace fls
