// adaRMS's ATen reference (contract: fused_ops.h): the model's reference path runs it, the autograd node's CPU
// forward runs it, the tests and benchmarks compare with it. Differentiable by autograd; any device and dtype.
#include <ATen/ATen.h>

#include "kernels/fused_ops.h"
#include "kernels/op_support.h"

namespace vlatune::kernels {

RmsRef adarms_norm_ref_stats(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& gate,
                             const at::Tensor& scale, const at::Tensor& shift, double eps) {
  at::Tensor h = delta.defined() ? x + cast_like(gate, x) * delta : x;
  const auto md = math_of(h);
  auto hf = h.to(md);
  auto rstd = at::rsqrt(hf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  auto normed = hf * rstd;
  auto y = normed * (scale.to(md) + 1.0) + shift.to(md);
  return {h, y.to(h.scalar_type()), rstd};
}

NormOutputs adarms_norm_residual_ref(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& gate,
                                     const at::Tensor& scale, const at::Tensor& shift, double eps) {
  RmsRef r = adarms_norm_ref_stats(x, delta, gate, scale, shift, eps);
  return {r.h, r.y};
}

}  // namespace vlatune::kernels
