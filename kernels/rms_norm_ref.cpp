// RMSNorm's ATen reference (contract: fused_ops.h): the model's reference path runs it, the autograd node's CPU
// forward runs it, the tests and benchmarks compare with it. Differentiable by autograd; any device and dtype.
#include <ATen/ATen.h>

#include "kernels/fused_ops.h"
#include "kernels/op_support.h"

namespace vlatune::kernels {

RmsRef rms_norm_ref_stats(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight, double eps) {
  at::Tensor h = delta.defined() ? x + delta : x;
  const auto md = math_of(h);
  auto hf = h.to(md);
  auto rstd = at::rsqrt(hf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  auto y = hf * rstd * (weight.to(md) + 1.0);
  return {h, y.to(h.scalar_type()), rstd};
}

RmsBackwardRef rms_norm_backward_ref(const at::Tensor& h, const at::Tensor& rstd, const at::Tensor& grad_y,
                                     const at::Tensor& grad_h, const at::Tensor& scale) {
  const auto md = math_of(h);
  auto r = rstd.view(keepdim_shape(h));
  auto n = h.to(md) * r;
  auto gy = grad_y.to(md);
  auto g = gy * (scale.to(md) + 1.0);
  auto dh = r * (g - n * (g * n).mean(-1, /*keepdim=*/true));
  if (grad_h.defined()) dh = dh + grad_h.to(md);
  return {dh, n, gy};
}

NormOutputs rms_norm_residual_ref(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight, double eps) {
  RmsRef r = rms_norm_ref_stats(x, delta, weight, eps);
  return {r.h, r.y};
}

}  // namespace vlatune::kernels
