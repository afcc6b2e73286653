// Error measures the kernel and model tests share.
#pragma once

#include <torch/torch.h>

namespace vlatune::test {

// Relative Frobenius error of `got` against `ref`, both taken to fp64 on the CPU (the absolute error when ref is 0).
inline double rel_err(const torch::Tensor& got, const torch::Tensor& ref) {
  auto g = got.detach().to(torch::kCPU, torch::kFloat64), r = ref.detach().to(torch::kCPU, torch::kFloat64);
  const double den = r.norm().item<double>();
  const double num = (g - r).norm().item<double>();
  return den == 0 ? num : num / den;
}

}  // namespace vlatune::test
