// GeGLU's ATen reference and its analytic backward (contract: fused_ops.h): the autograd node's CPU path, the tests'
// and benchmarks' oracle. Any device and dtype.
#include <ATen/ATen.h>

#include "kernels/fused_ops.h"

namespace vlatune::kernels {

at::Tensor geglu_ref(const at::Tensor& merged) {
  const int64_t f = merged.size(-1) / 2;
  return at::gelu(merged.narrow(-1, 0, f), "tanh") * merged.narrow(-1, f, f);
}

at::Tensor geglu_backward_ref(const at::Tensor& grad, const at::Tensor& merged) {
  const int64_t f = merged.size(-1) / 2;
  auto gate = merged.narrow(-1, 0, f), up = merged.narrow(-1, f, f);
  return at::cat({at::gelu_backward(grad * up, gate, "tanh"), grad * at::gelu(gate, "tanh")}, -1);
}

}  // namespace vlatune::kernels
