// GELU's ATen reference (contract: fused_ops.h): SigLIP's reference MLP, the autograd node's CPU path, the tests'
// and benchmarks' oracle. Any device and dtype.
#include <ATen/ATen.h>

#include "kernels/fused_ops.h"

namespace vlatune::kernels {

at::Tensor gelu_ref(const at::Tensor& x) {
  return at::gelu(x, "tanh");
}

}  // namespace vlatune::kernels
