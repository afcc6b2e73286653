// Gemma RMSNorm with the residual add fused, forward and backward kernels (rms_norm.cu): torch-free params and
// raw-pointer launchers. The ATen reference: rms_norm_ref.cpp; checks, dispatch and autograd: rms_norm_autograd.cpp
// (entry point in fused_ops.h).
#pragma once

#include <cstdint>

#include "kernels/act_dtype.h"

namespace vlatune::kernels {

// h = x + delta (rounded to the dtype, as ATen's add; h = x when delta is null),
// y = h * rstd * (1 + weight), rstd = rsqrt(mean(h^2) + eps), all in fp32.
struct RmsNormFwdParams {
  ActDtype dtype = ActDtype::kBf16;
  int64_t rows = 0, width = 0;
  const void* x = nullptr;         // [rows, width]
  const void* delta = nullptr;     // [rows, width] or null
  const float* weight = nullptr;   // [width], fp32
  const void* weight_t = nullptr;  // or [width] in the activation dtype, read instead (no fp32 copy to make)
  float eps = 1e-6f;
  void* h = nullptr;      // [rows, width], written when delta != null
  void* y = nullptr;      // [rows, width]
  float* rstd = nullptr;  // [rows]
};

// grad_x = grad_h + d(y)/d(h)^T grad_y (the gradient of x and of delta alike); weight_partials[block, :] =
// per-block sums over rows of grad_y * h * rstd (the caller sums the rms_norm_bwd_blocks(rows) rows).
struct RmsNormBwdParams {
  ActDtype dtype = ActDtype::kBf16;
  int64_t rows = 0, width = 0;
  const void* grad_y = nullptr;      // [rows, width]
  const void* grad_h = nullptr;      // [rows, width] or null: the gradient reaching h from its other uses
  const void* h = nullptr;           // [rows, width]: the normalized input saved by the forward
  const float* weight = nullptr;     // [width]
  const void* weight_t = nullptr;    // or [width] in the activation dtype, read instead
  const float* rstd = nullptr;       // [rows]
  void* grad_x = nullptr;            // [rows, width]
  float* weight_partials = nullptr;  // [rms_norm_bwd_blocks(rows), width]
};

// True when the kernels handle this width (a multiple of 16 bytes of the dtype, at most 1,024 16-byte vectors).
bool rms_norm_supported(ActDtype dtype, int64_t width);
int64_t rms_norm_bwd_blocks(int64_t rows);
void launch_rms_norm_fwd(const RmsNormFwdParams& p, CUstream_st* stream);
void launch_rms_norm_bwd(const RmsNormBwdParams& p, CUstream_st* stream);

}  // namespace vlatune::kernels
