// LayerNorm's ATen reference (contract: fused_ops.h): the model's reference path runs it, the tests and benchmarks
// compare with it. Differentiable by autograd; any device and dtype.
#include <ATen/ATen.h>

#include "kernels/fused_ops.h"
#include "kernels/op_support.h"

namespace vlatune::kernels {

NormOutputs layer_norm_residual_ref(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight,
                                    const at::Tensor& bias, double eps) {
  at::Tensor h = delta.defined() ? x + delta : x;
  return {h, at::layer_norm(h, {h.size(-1)}, cast_like(weight, h), cast_like(bias, h), eps)};
}

}  // namespace vlatune::kernels
