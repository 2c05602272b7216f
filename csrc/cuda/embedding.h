// CUDA launchers of the embedding family (csrc/cuda/embedding.cu). Plain C++ declarations so the ATen
// wrapper can include them without CUDA headers; each returns a cudaError_t as int (0 = ok).
#pragma once
#include <cstdint>

#include "fls/common.h"

namespace fls {
namespace cuda {

// out[r, :] = dropout(scale * weight[tokens[r], :] + pos_weight[positions[r], :]), zeros where
// tokens[r] == padding_idx; dropout element index r * dim + c. tokens, positions: [n] int64 (positions
// unused when pos_weight is null); weight: [num_embeddings, dim] dt, pos_weight: [num_positions, dim] dt;
// out: [n, dim] dt. Ids are range-checked on the device (no host sync): an id outside [0, limit) prints
// "embedding: token id <id> exceeds num_embeddings <limit> ..." (or "position ... max positions ...",
// "... is negative") and fails a device assert, so the next CUDA call of the process fails.
int embedding_fwd(DType dt, const int64_t* tokens, const int64_t* positions, const void* weight,
                  const void* pos_weight, void* out, int64_t n, int64_t dim, int64_t num_embeddings,
                  int64_t num_positions, int64_t padding_idx, double scale, DropoutParams d, void* stream);

// Key value that marks a row giving no gradient (a pad token) in embedding_bwd_table's sorted keys.
constexpr int64_t kNoGradKey = INT64_MAX;

// Gradient of one table: out[k, :] = mult * sum over rows r with key[r] == k, in increasing r, of
// grad[r, :] * dropout factor of element r * dim + c (deterministic: fixed order, no atomics).
// sorted_keys, order: [n] int64, a STABLE ascending sort of the keys (order[i] = row of the i-th key), pad
// rows keyed kNoGradKey (skipped); grad: [n, dim] dt; out: [num_rows, dim] dt, zero-filled by the caller
// (rows no key names stay zero). A key outside [0, num_rows) prints the id and the limit and fails a device assert
// (keys_are_positions picks the wording).
int embedding_bwd_table(DType dt, const void* grad, const int64_t* sorted_keys, const int64_t* order, int64_t n,
                        int64_t dim, int64_t num_rows, bool keys_are_positions, double mult, DropoutParams d,
                        void* out, void* stream);

}  // namespace cuda
}  // namespace fls
