// SigLIP's LayerNorm with the residual add fused, forward and backward kernels (layer_norm.cu): torch-free params
// and raw-pointer launchers. The ATen reference: layer_norm_ref.cpp; checks, dispatch and autograd:
// layer_norm_autograd.cpp (entry point in fused_ops.h).
#pragma once

#include <cstdint>

#include "kernels/act_dtype.h"

namespace vlatune::kernels {

// SigLIP's pre-LN blocks: h = x + delta (rounded to the dtype, as ATen's add; h = x when delta is null),
// y = (h - mean) * rstd * weight + bias, mean and rstd = rsqrt(var + eps) (biased variance) in fp32.
// weight and bias are fp32 copies of the values the reference uses (the parameters cast to the activation dtype),
// or (weight_t, bias_t) those parameters themselves when they are in the activation dtype: the same values.
struct LayerNormFwdParams {
  ActDtype dtype = ActDtype::kBf16;
  int64_t rows = 0, width = 0;
  const void* x = nullptr;        // [rows, width]
  const void* delta = nullptr;    // [rows, width] or null
  const float* weight = nullptr;  // [width]
  const float* bias = nullptr;    // [width]
  // Or both in the activation dtype, read instead (no fp32 copies to make): set together.
  const void* weight_t = nullptr;
  const void* bias_t = nullptr;
  float eps = 1e-6f;
  void* h = nullptr;      // [rows, width], written when delta != null
  void* y = nullptr;      // [rows, width]
  float* mean = nullptr;  // [rows]
  float* rstd = nullptr;  // [rows]
};

// grad_x = grad_h + d(y)/d(h)^T grad_y (the gradient of x and of delta alike). weight_partials[block][0][:] =
// per-block sums of grad_y * (h - mean) * rstd (weight), [block][1][:] = of grad_y (bias); the caller sums the
// layer_norm_bwd_blocks(dtype, rows, width) blocks.
struct LayerNormBwdParams {
  ActDtype dtype = ActDtype::kBf16;
  int64_t rows = 0, width = 0;
  const void* grad_y = nullptr;  // [rows, width]
  const void* grad_h = nullptr;  // [rows, width] or null
  const void* h = nullptr;       // [rows, width]
  const float* weight = nullptr;
  const void* weight_t = nullptr;  // or the weight in the activation dtype, read instead
  const float* mean = nullptr;
  const float* rstd = nullptr;
  void* grad_x = nullptr;
  float* weight_partials = nullptr;  // [layer_norm_bwd_blocks(dtype, rows, width), 2, width]
};

bool layer_norm_supported(ActDtype dtype, int64_t width);
int64_t layer_norm_bwd_blocks(ActDtype dtype, int64_t rows, int64_t width);
void launch_layer_norm_fwd(const LayerNormFwdParams& p, CUstream_st* stream);
void launch_layer_norm_bwd(const LayerNormBwdParams& p, CUstream_st* stream);

}  // namespace vlatune::kernels
