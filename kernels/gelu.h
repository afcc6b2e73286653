// SigLIP's MLP activation (tanh GELU), forward and backward kernels (gelu.cu): torch-free params and raw-pointer
// launchers. The ATen reference: gelu_ref.cpp; checks, dispatch and autograd (gelu_linear, the GELU and fc2 as one
// node): gelu_autograd.cpp (entry points in fused_ops.h).
#pragma once

#include <cstdint>

#include "kernels/act_dtype.h"

namespace vlatune::kernels {

// On the fc1 output (bias already added by the GEMM): out = round(gelu_tanh(x)).
// Backward: grad_x = round(gelu'(x) * grad) and, with act_out (which may alias grad_out), the forward's output.
struct GeluParams {
  ActDtype dtype = ActDtype::kBf16;
  int64_t numel = 0;  // a multiple of 16 bytes of the dtype
  const void* x = nullptr;
  const void* grad_out = nullptr;  // backward only
  void* out = nullptr;             // forward: gelu(x); backward: grad_x
  void* act_out = nullptr;         // backward only, optional
};

bool gelu_supported(ActDtype dtype, int64_t numel);
void launch_gelu_fwd(const GeluParams& p, CUstream_st* stream);
void launch_gelu_bwd(const GeluParams& p, CUstream_st* stream);

}  // namespace vlatune::kernels
