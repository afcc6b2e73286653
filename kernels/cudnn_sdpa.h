// cuDNN's fused attention (its Hopper flash kernels) through the cudnn_frontend graph API, with a padding mask
// (in sample b only queries [0, seq_q[b]) and keys [0, seq_kv[b]) take part) or without a mask. Torch-free (raw
// pointers, element strides) so that the heavy frontend headers stay in one translation unit (cudnn_sdpa.cpp).
//
// Why: Pi0.5's joint mask is a key-padding mask per sample once the keys are ordered valid-first
// (varlen_attention.h). cuDNN reads a padding mask as two lengths per sample and skips the tiles past them, where
// its SDPA with the [B, 1, N, N] boolean mask read the mask as a bias in every tile (0.84 ms forward per layer at
// batch 32 against 0.30 ms unmasked, scripts/dev/attn_bench.py), and FlashAttention-2's varlen kernels are
// Ampere kernels (0.56 ms forward, 1.9 ms backward per layer in the step).
//
// Graphs are built once per problem (shape, strides, scale) and per thread (the autograd engine runs backward on
// its own thread; a cuDNN handle belongs to one thread), then cached.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include <cuda_runtime_api.h>

namespace vlatune::kernels {

// One attention problem. Tensors are [batch, heads, seq, head_dim] by element strides (bf16); stats
// (log-sum-exp of the scaled scores, fp32) are contiguous [batch, heads, seq_q]. K and V have kv_heads heads
// (heads a multiple of it: grouped-query attention, cuDNN sums dK and dV over the group).
struct SdpaProblem {
  int64_t batch = 0, heads = 0, kv_heads = 0, seq_q = 0, seq_kv = 0, head_dim = 0;
  std::array<int64_t, 4> q_stride{}, k_stride{}, v_stride{}, o_stride{};  // o_stride: O and dO
  std::array<int64_t, 4> dq_stride{}, dk_stride{}, dv_stride{};           // backward outputs
  float scale = 1.0f;
  bool padding_mask = true;  // false: every query sees every key (seq_q / seq_kv pointers unused)
};

struct SdpaForwardArgs {
  const void *q = nullptr, *k = nullptr, *v = nullptr;
  const int32_t *seq_q = nullptr, *seq_kv = nullptr;  // device [batch]
  void* o = nullptr;
  float* stats = nullptr;
};

struct SdpaBackwardArgs {
  const void *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr, *d_o = nullptr;
  const float* stats = nullptr;
  const int32_t *seq_q = nullptr, *seq_kv = nullptr;
  void *dq = nullptr, *dk = nullptr, *dv = nullptr;  // written (keys past seq_kv: unspecified)
};

// Device memory of at least `bytes` that stays valid for work queued on the call's stream (e.g. from a
// stream-ordered caching allocator); nullptr for 0 bytes is fine.
using SdpaWorkspace = std::function<void*(size_t bytes)>;

// Whether this build has the cuDNN frontend (CMake found cudnn_frontend.h and libcudnn).
bool cudnn_sdpa_compiled();

// "" when cuDNN builds both graphs of `p` on `device`, else why not. Answered once per problem and device for the
// process (cheap to ask again); the graphs stay cached for the thread that first asked, and other threads build
// their own on first use.
std::string cudnn_sdpa_check(const SdpaProblem& p, int device);

// Queue the forward / backward on `stream` (the current device's). Throws std::runtime_error naming the problem
// and cuDNN's message when a graph cannot be built or run.
void cudnn_sdpa_forward(const SdpaProblem& p, const SdpaForwardArgs& args, const SdpaWorkspace& workspace,
                        cudaStream_t stream);
void cudnn_sdpa_backward(const SdpaProblem& p, const SdpaBackwardArgs& args, const SdpaWorkspace& workspace,
                         cudaStream_t stream);

// The problem as text, for errors and logs.
std::string describe(const SdpaProblem& p);

}  // namespace vlatune::kernels
