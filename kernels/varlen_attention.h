// The joint attention's mask without a mask tensor: FlashAttention-2's variable-length kernels (ATen's
// _flash_attention_forward / _flash_attention_backward) over sequences whose keys are gathered from the valid key
// positions.
//
// Pi0.5's mask (pi05_spec §3; model/pi05.cpp step 4): a prefix query sees the valid prefix keys, a suffix query
// the valid prefix keys and every suffix key. So each sample becomes two sequences, (its P prefix queries | its
// valid prefix keys) and (its S suffix queries | its valid prefix keys, then its S suffix keys); with the last
// layer's dead prefix queries skipped, one (suffix queries | valid prefix + suffix keys) per sample. The queries
// stay where they are (token-major [B * Tq, H, D]: a sample's prefix and suffix rows are already consecutive);
// the keys and values (one head in Pi0.5: 12.5 MB per layer at batch 32) are gathered per call, and their
// gradients gathered back: a key row's gradient is its slot's, plus its second slot's when it serves both sequences
// of its sample (a valid prefix key) -- two gathers and one add, one rounding, no atomics (an index_add_ scatter
// cost 0.14 ms per call on the H200).
//
// Why: on the H200, cuDNN's SDPA with the [B, 1, N, N] boolean mask took 0.84-0.90 ms forward and 2.4 ms backward
// per layer at batch 32 (scripts/dev/attn_bench.py; the same kernels without a mask: 0.30 / 1.83 ms): the mask
// becomes an additive bias read by every tile. The varlen kernels read no mask.
//
// Exactness: valid rows are unchanged (each sees exactly its allowed keys). A padded text query, whose old row saw
// the valid prefix keys and itself, now sees the valid prefix keys only: its output is dead (no valid row reads a
// padded position, which is masked as a key), so the loss and every parameter gradient are the same.
//
// No host synchronization: the layout is built on the device with capacity-sized buffers (2 B P + B S key slots);
// slots past a call's last sequence are never read by the kernels.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

namespace vlatune::kernels {

struct VarlenLayout {
  at::Tensor cu_q, cu_k;  // int32 [sequences + 1]: sequence starts in the query rows / the packed key slots
  at::Tensor gather;      // int64 [slots + 1]: key row per packed slot (unused slots and the last: row 0, never read)
  // int64 [rows_k]: a key row's slot, and its second slot (prefix queries: a valid prefix key's place in its
  // sample's suffix sequence); `slots` (the last slot, whose gradient is zeroed) where there is none.
  at::Tensor first_slot, second_slot;  // second_slot undefined without prefix queries (one slot at most)
  int64_t slots = 0;                   // capacity: 2 B P + B S with prefix queries, else B N
  int64_t max_q = 0, max_k = 0;
  int64_t rows_q = 0, rows_k = 0;  // B * Tq query rows, B * N key rows
};

// valid [B, N] bool (N = prefix_len + S; suffix positions valid). prefix_queries: two sequences per sample over all
// B * N query rows; false: the suffix queries alone (B * S rows).
VarlenLayout joint_varlen_layout(const at::Tensor& valid, int64_t prefix_len, bool prefix_queries);

// Whether varlen_attention runs for activations like `x`: a CUDA build, x on CUDA (compute capability 8.0+), bf16
// or fp16, head_dim a multiple of 8 and at most 256, and the environment does not say VLATUNE_VARLEN_ATTENTION=0
// (the A/B switch: the masked SDPA path instead).
bool varlen_attention_supported(const at::Tensor& x, int64_t head_dim);

// q [rows_q, H, D], k and v [rows_k, Hk, D] (H a multiple of Hk), contiguous -> out [rows_q, H, D]; autograd.
at::Tensor varlen_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const VarlenLayout& layout,
                            double scale);

}  // namespace vlatune::kernels
