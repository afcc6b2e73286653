// The joint attention's mask without a mask tensor, on one of two backends:
// - cuDNN (default where it runs: kernels/cudnn_sdpa.h): each sample's keys reordered into one buffer, its S
//   suffix keys first, then its valid prefix keys, then the padded ones. Prefix queries see buffer rows
//   [S, S + valid) and suffix queries rows [0, S + valid): two padding-mask calls (lengths per sample), keys
//   gathered once per layer (12.5 MB at batch 32) and their gradients gathered back.
// - FlashAttention-2 (ATen's _flash_attention_forward / _flash_attention_backward) over variable-length sequences
//   whose keys are gathered from the valid key positions.
//
// Pi0.5's mask (pi05_spec §3; model/pi05.cpp step 4): a prefix query sees the valid prefix keys, a suffix query
// the valid prefix keys and every suffix key. Varlen: each sample becomes two sequences, (its P prefix queries |
// its valid prefix keys) and (its S suffix queries | its valid prefix keys, then its S suffix keys); with the last
// layer's dead prefix queries skipped, one (suffix queries | valid prefix + suffix keys) per sample. The queries
// stay where they are (token-major [B * Tq, H, D]: a sample's prefix and suffix rows are already consecutive);
// the keys and values (one head in Pi0.5: 12.5 MB per layer at batch 32) are gathered per call, and their
// gradients gathered back: a key row's gradient is its slot's, plus its second slot's when it serves both sequences
// of its sample (a valid prefix key) -- two gathers and one add, one rounding, no atomics (an index_add_ scatter
// cost 0.14 ms per call on the H200).
//
// Why: on the H200, cuDNN's SDPA with the [B, 1, N, N] boolean mask took 0.84-0.90 ms forward and 2.4 ms backward
// per layer at batch 32 (scripts/dev/attn_bench.py; the same kernels without a mask: 0.30 / 1.83 ms): the mask
// becomes an additive bias read by every tile. Neither backend here reads a mask. FlashAttention-2 (Ampere
// kernels) took 0.56 ms forward and 2.05 ms backward per layer in the step, plus 0.34 ms of gathers and GQA head
// sums (RESULTS "third session"); cuDNN's padding mask skips the tiles past each length and sums GQA itself.
//
// Exactness: valid rows are unchanged (each sees exactly its allowed keys). A padded text query, whose old row saw
// the valid prefix keys and itself, now sees the valid prefix keys only: its output is dead (no valid row reads a
// padded position, which is masked as a key), so the loss and every parameter gradient are the same. On cuDNN the
// padded queries after a sample's last valid prefix position (the text padding) are not computed at all: their
// output rows are zeros, and their gradient, zero for a dead row anyway, too.
//
// No host synchronization: the layout is built on the device with capacity-sized buffers (2 B P + B S key slots
// for FlashAttention, B N for cuDNN); slots past a call's last sequence are never read by the kernels.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "kernels/attention_backend.h"

namespace vlatune::kernels {

enum class VarlenBackend { kFlash, kCudnn };

struct VarlenLayout {
  VarlenBackend backend = VarlenBackend::kFlash;
  // FlashAttention-2:
  at::Tensor cu_q, cu_k;  // int32 [sequences + 1]: sequence starts in the query rows / the packed key slots
  at::Tensor gather;      // int64 [slots + 1]: key row per packed slot (unused slots and the last: row 0, never read)
  // int64 [rows_k]: a key row's slot, and its second slot (prefix queries: a valid prefix key's place in its
  // sample's suffix sequence); `slots` (the last slot, whose gradient is zeroed) where there is none.
  at::Tensor first_slot, second_slot;  // second_slot undefined without prefix queries (one slot at most)
  int64_t slots = 0;                   // capacity: 2 B P + B S with prefix queries, else B N
  int64_t max_q = 0, max_k = 0;
  int64_t rows_q = 0, rows_k = 0;  // B * Tq query rows, B * N key rows
  // cuDNN: sample b's keys in buffer rows [b N, (b + 1) N): suffix keys, valid prefix keys, padded prefix keys.
  at::Tensor kv_order;      // int64 [B N]: buffer row -> key row
  at::Tensor kv_grad_slot;  // int64 [B N]: key row -> buffer row; B N (a zeroed extra row) for a padded key
  // int32 [B]: the calls' lengths; prefix_seq_q ends at the sample's last valid prefix position (at least 1).
  at::Tensor prefix_seq_q, prefix_seq_kv, suffix_seq_q, suffix_seq_kv;
  int64_t batch = 0, prefix_len = 0, suffix_len = 0;
};

// valid [B, N] bool (N = prefix_len + S; suffix positions valid). prefix_queries: two sequences per sample over all
// B * N query rows; false: the suffix queries alone (B * S rows).
VarlenLayout joint_varlen_layout(const at::Tensor& valid, int64_t prefix_len, bool prefix_queries,
                                 VarlenBackend backend = VarlenBackend::kFlash);
// The suffix-queries-only layout (the last layer, its dead prefix queries skipped) of the same `valid`, from the
// layout with prefix queries: cuDNN's shares its tensors (the key order and lengths do not depend on the queries),
// FlashAttention-2's is built (its key slots do).
VarlenLayout suffix_queries_layout(const VarlenLayout& with_prefix_queries, const at::Tensor& valid);

// Whether varlen_attention runs for activations like `x`: a CUDA build, x on CUDA (compute capability 8.0+), bf16
// or fp16, head_dim a multiple of 8 and at most 256, and `backend` is not kSdpa (the masked SDPA path instead).
bool varlen_attention_supported(const at::Tensor& x, int64_t head_dim,
                                AttentionBackend backend = AttentionBackend::kAuto);

// The joint attention's shape, for choosing a backend.
struct JointAttentionShape {
  int64_t batch = 0, prefix_len = 0, suffix_len = 0, heads = 0, kv_heads = 0, head_dim = 0;
  double scale = 1.0;
};

// kAuto: cuDNN where this build has it, x is bf16 and cuDNN builds the shape's graphs on x's device (checked once
// per shape; a refusal is printed once with cuDNN's reason), else FlashAttention-2; kCudnn: cuDNN or a
// std::runtime_error with the reason; kFlash: FlashAttention-2. `x`: any activation of the model (device, dtype).
// Assumes varlen_attention_supported(x, shape.head_dim, backend).
VarlenBackend choose_varlen_backend(const at::Tensor& x, const JointAttentionShape& shape,
                                    AttentionBackend backend = AttentionBackend::kAuto);
const char* to_string(VarlenBackend backend);

// q [rows_q, H, D], k and v [rows_k, Hk, D] (H a multiple of Hk), contiguous -> the output per branch, autograd:
// {prefix [B, P, H, D] or [B * P, H, D], suffix [B, S, H, D] or [B * S, H, D]} (the layout's prefix_queries), else
// {suffix}. cuDNN writes each branch contiguous (the o_proj inputs as they are); FlashAttention-2's are views of one
// token-major output.
std::vector<at::Tensor> varlen_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                         const VarlenLayout& layout, double scale);

}  // namespace vlatune::kernels
