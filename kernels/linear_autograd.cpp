// linear's torch entry point (contract: fused_ops.h): at::linear, except CUDA bf16/fp16 Linears with a bias, whose
// node sums the bias gradient with bias_grad (ATen's bf16 column reductions took about twice the time of reading
// the bytes: bench/RESULTS.md, sixth session). ATen's GEMMs either way.
#include <torch/torch.h>

#include <optional>

#include "kernels/fused_ops.h"
#include "kernels/op_support.h"

namespace vlatune::kernels {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

bool own_node(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  const bool half = x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf;
  return bias.defined() && x.defined() && x.is_cuda() && half && x.dim() >= 1 && x.numel() > 0 && weight.defined() &&
         weight.dim() == 2 && weight.numel() > 0 && x.size(-1) == weight.size(1) &&
         weight.scalar_type() == x.scalar_type() && weight.device() == x.device() && bias.dim() == 1 &&
         bias.size(0) == weight.size(0) && bias.scalar_type() == x.scalar_type() && bias.device() == x.device();
}

struct LinearFn : public torch::autograd::Function<LinearFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias) {
    ctx->save_for_backward({x, weight});
    return at::linear(x, weight, bias);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1];
    variable_list result(3);  // x, weight, bias
    if (!grads[0].defined()) return result;
    const int64_t n = weight.size(0), k = weight.size(1);
    const at::Tensor g = grads[0].reshape({-1, n});
    if (ctx->needs_input_grad(0)) result[0] = at::mm(g, weight).view(x.sizes());
    if (ctx->needs_input_grad(1)) result[1] = at::mm(g.t(), x.reshape({-1, k}));
    if (ctx->needs_input_grad(2)) result[2] = bias_grad(g, g.scalar_type());
    return result;
  }
};

}  // namespace

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  if (!own_node(x, weight, bias)) return at::linear(x, weight, bias);
  return LinearFn::apply(x, weight, bias);
}

}  // namespace vlatune::kernels
