// GeGLU on the merged gate+up GEMM output, forward and backward kernels (geglu.cu): torch-free params and
// raw-pointer launchers. The ATen reference: geglu_ref.cpp; checks, dispatch and autograd (geglu_linear, the
// GeGLU and the down projection as one node): geglu_autograd.cpp (entry points in fused_ops.h).
#pragma once

#include <cstdint>

#include "kernels/act_dtype.h"

namespace vlatune::kernels {

// merged [rows, 2F] = [gate | up] (the merged gate+up GEMM output) -> out [rows, F] = round(round(gelu_tanh(gate))
// * up) (ATen's two roundings). Backward: grad_merged [rows, 2F] = [round(round(g * up) * gelu'(gate)) |
// round(g * round(gelu(gate)))]. With act_out, the backward also writes the forward's output there (the down
// projection's input, for its weight gradient, so the backward does not rerun the forward kernel); act_out may be
// grad_out itself (each element is read before it is overwritten, by the same thread).
struct GegluParams {
  ActDtype dtype = ActDtype::kBf16;
  int64_t rows = 0, features = 0;  // F
  const void* merged = nullptr;
  const void* grad_out = nullptr;  // backward only
  void* out = nullptr;             // forward: [rows, F]; backward: grad_merged [rows, 2F]
  void* act_out = nullptr;         // backward only, optional: [rows, F]
};

bool geglu_supported(ActDtype dtype, int64_t features);
void launch_geglu_fwd(const GegluParams& p, CUstream_st* stream);
void launch_geglu_bwd(const GegluParams& p, CUstream_st* stream);

}  // namespace vlatune::kernels
