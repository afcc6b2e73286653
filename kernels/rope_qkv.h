// The merged QKV outputs of both branches -> the attention inputs with RoPE, one pass (rope_qkv.cu): torch-free
// params and raw-pointer launchers. The ATen reference: rope_qkv_ref.cpp; checks, dispatch and autograd:
// rope_qkv_autograd.cpp (entry points in fused_ops.h).
#pragma once

#include <cstdint>

#include "kernels/act_dtype.h"

namespace vlatune::kernels {

// The merged QKV GEMM outputs of both branches -> q [B, H, Tq, D], k/v [B, Hk, N, D] (contiguous, the attention
// layout), N = P + S (prefix positions first), with the half-split rotation of q and k in fp32:
//   out[i] = u*cos - v*sin, out[i + D/2] = v*cos + u*sin (u = x[i], v = x[i + D/2]; cos/sin [B, N, D/2] fp32).
// A prefix row holds [q (when prefix_q), k, v] heads; a suffix row [q, k, v]. Without prefix_q the queries cover
// the suffix positions only (Tq = S, the last layer's skipped prefix rows), else Tq = N.
struct RopeQkvParams {
  ActDtype dtype = ActDtype::kBf16;
  int64_t batch = 0, prefix_len = 0, suffix_len = 0;
  int heads = 0, kv_heads = 0, head_dim = 0;
  bool prefix_q = true;
  // Forward: read qkv_*, write q, k, v. Backward: read q, k, v (the gradients), write qkv_* (their gradients).
  void* qkv_prefix = nullptr;  // [B, P, ((prefix_q ? H : 0) + 2 Hk) * D]
  void* qkv_suffix = nullptr;  // [B, S, (H + 2 Hk) * D]
  const float* cos = nullptr;  // [B, N, D/2]
  const float* sin = nullptr;
  void* q = nullptr;  // token-major: [B, Tq, H, D] (Tq = P + S, or S without prefix_q)
  void* k = nullptr;  // [B, P + S, Hk, D]
  void* v = nullptr;  // [B, P + S, Hk, D]
};

bool rope_qkv_supported(ActDtype dtype, int head_dim);
void launch_rope_qkv_fwd(const RopeQkvParams& p, CUstream_st* stream);
void launch_rope_qkv_bwd(const RopeQkvParams& p, CUstream_st* stream);

}  // namespace vlatune::kernels
