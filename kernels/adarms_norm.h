// adaRMS (the action expert's norm) with the gated residual fused, forward and backward kernels (adarms_norm.cu):
// torch-free params and raw-pointer launchers. The ATen reference: adarms_norm_ref.cpp; checks, dispatch and
// autograd: adarms_norm_autograd.cpp (entry point in fused_ops.h).
#pragma once

#include <cstdint>

#include "kernels/act_dtype.h"

namespace vlatune::kernels {

// Rows are [batch, tokens]; scale/shift/gate are rows of the batch (views of the [batch, 3 * width] modulation:
// `mod_stride` elements between batch rows, last dim contiguous).
//   h = x + round(gate * delta)          (the gated residual, rounded as ATen's mul then add; h = x without delta)
//   y = (h * rstd) * (1 + scale) + shift, rstd = rsqrt(mean(h^2) + eps)
struct AdaRmsNormFwdParams {
  ActDtype dtype = ActDtype::kBf16;
  int64_t batch = 0, tokens = 0, width = 0;
  const void* x = nullptr;      // [batch * tokens, width]
  const void* delta = nullptr;  // [batch * tokens, width] or null
  const void* gate = nullptr;   // [batch, width] rows, stride gate_stride; used only with delta
  const void* scale = nullptr;  // [batch, width] rows, stride mod_stride
  const void* shift = nullptr;  // [batch, width] rows, stride mod_stride
  int64_t gate_stride = 0, mod_stride = 0;
  float eps = 1e-6f;
  void* h = nullptr;  // written when delta != null
  void* y = nullptr;
  float* rstd = nullptr;  // [batch * tokens]
};

// The backward recomputes h from x, delta and gate (it saves x and delta, not h). Writes grad_x (the total
// gradient of h), grad_delta = grad_x * gate (with delta), and per-(split, batch) partial sums
// partials[split][b][0/1/2][:] of grad_y * h * rstd (scale), grad_y (shift), grad_x * delta (gate).
struct AdaRmsNormBwdParams {
  ActDtype dtype = ActDtype::kBf16;
  int64_t batch = 0, tokens = 0, width = 0;
  const void* grad_y = nullptr;
  const void* grad_h = nullptr;  // or null
  const void* x = nullptr;
  const void* delta = nullptr;  // or null
  const void* gate = nullptr;
  const void* scale = nullptr;
  int64_t gate_stride = 0, mod_stride = 0;
  const float* rstd = nullptr;
  void* grad_x = nullptr;
  void* grad_delta = nullptr;  // written when delta != null
  float* partials = nullptr;   // [adarms_norm_bwd_splits(tokens), batch, 3, width]
};

// The widths the kernels handle are RMSNorm's (rms_norm_supported).
bool adarms_norm_supported(ActDtype dtype, int64_t width);
int64_t adarms_norm_bwd_splits(int64_t tokens);
void launch_adarms_norm_fwd(const AdaRmsNormFwdParams& p, CUstream_st* stream);
void launch_adarms_norm_bwd(const AdaRmsNormBwdParams& p, CUstream_st* stream);

}  // namespace vlatune::kernels
