// Self-attention read straight from a merged QKV output, on cuDNN (cudnn_sdpa.h): SigLIP's layers, where every
// query sees every key. q, k and v are strided views of the merged [N, T, 3 W] GEMM output (no split copies); the
// output comes contiguous [N, T, W] (out_proj's input as it is); the backward writes dq, dk and dv straight into one
// [N, T, 3 W] gradient (the merged GEMM's), where SDPA's three gradients were stacked by a copy (RESULTS "fourth
// session": 27 copies of 113 MB per step at batch 32).
#pragma once

#include <ATen/core/Tensor.h>

#include "kernels/attention_backend.h"

namespace vlatune::kernels {

// Whether qkv_attention runs for `qkv` [N, T, 3 W] with `heads` heads: a build with the cuDNN frontend, bf16 on
// CUDA, contiguous, head_dim = W / heads a multiple of 8 and at most 256, `backend` not kFlash, and cuDNN builds
// the shape's graphs (cudnn_sdpa_check).
bool qkv_attention_supported(const at::Tensor& qkv, int64_t heads, AttentionBackend backend = AttentionBackend::kAuto);

// softmax(q k^T * scale) v per head -> [N, T, W]; autograd (the gradient of qkv in one tensor).
at::Tensor qkv_attention(const at::Tensor& qkv, int64_t heads, double scale);

}  // namespace vlatune::kernels
