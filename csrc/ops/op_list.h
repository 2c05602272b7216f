// The ops that dispatch on their tensors' device, by name. Each device's registration (cpu_ops.cpp,
// cuda/cuda_ops.cpp) defines one function per name, with the op's schema signature, and registers them all
// with FLS_FOR_EACH_DEVICE_OP(FLS_REGISTER_OP). dropout_mask is not here: it has no tensor argument to
// dispatch on (see cuda_dropout_mask_impl in dropout.h).
#pragma once

#define FLS_FOR_EACH_DEVICE_OP(X)      \
  X(layer_norm_fwd)                    \
  X(layer_norm_bwd)                    \
  X(bias_dropout_residual_fwd)         \
  X(bias_dropout_residual_bwd)         \
  X(bias_act_dropout_fwd)              \
  X(bias_act_dropout_bwd)              \
  X(attention_softmax_fwd)             \
  X(attention_softmax_bwd)             \
  X(qkv_bias_split)                    \
  X(qkv_bias_split_bwd)                \
  X(merge_heads)                       \
  X(embedding_fwd)                     \
  X(embedding_bwd)                     \
  X(label_smoothed_cross_entropy_fwd)  \
  X(label_smoothed_cross_entropy_bwd)  \
  X(adam_step_)

// Inside TORCH_LIBRARY_IMPL(fairseq_lightseq, <device>, m): registers the function `name` for the op `name`.
#define FLS_REGISTER_OP(name) m.impl(#name, &name);
