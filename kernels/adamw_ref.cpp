// The ATen reference of the fused AdamW and of the global gradient norm (contract: adamw_ops.h). Plain tensor
// ops in fp32, in torch::optim::AdamW's order of operations, so that on fp32 tensors it matches torch's own
// optimizer to rounding; bf16 storage is read into fp32 and rounded back (to nearest even) once per step, as the
// CUDA kernel does.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>

#include "kernels/adamw_ops.h"

namespace vlatune::kernels {

void adamw_step_ref(std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                    std::vector<at::Tensor>& exp_avg, std::vector<at::Tensor>& exp_avg_sq,
                    std::vector<at::Tensor>* master, const AdamwParams& p, const at::Tensor& grad_scale) {
  at::NoGradGuard no_grad;  // parameters are leaves that require grad: in-place updates must not be recorded
  at::Tensor scale;         // fp32 0-d: host factor times the device factor
  if (grad_scale.defined()) {
    // The reference may sync: it decides the skip on the host, where the kernel decides it per block.
    if (!std::isfinite(grad_scale.item<double>())) return;
    scale = grad_scale.to(at::kFloat) * p.grad_scale;
  } else if (p.grad_scale != 1.0) {
    scale = at::scalar_tensor(p.grad_scale, at::kFloat);
  }
  const double bias_correction1 = 1.0 - std::pow(p.beta1, static_cast<double>(p.step));
  const double bias_correction2 = 1.0 - std::pow(p.beta2, static_cast<double>(p.step));
  const double step_size = p.lr / bias_correction1;
  const double bias_correction2_sqrt = std::sqrt(bias_correction2);

  for (size_t i = 0; i < params.size(); ++i) {
    at::Tensor& stored_p = master != nullptr ? (*master)[i] : params[i];
    at::Tensor p32 = stored_p.to(at::kFloat);  // a copy for bf16 storage, the tensor itself for fp32
    at::Tensor m32 = exp_avg[i].to(at::kFloat);
    at::Tensor v32 = exp_avg_sq[i].to(at::kFloat);
    at::Tensor g32 = grads[i].defined() ? grads[i].to(at::kFloat) : at::zeros_like(p32);
    if (scale.defined()) g32 = g32 * scale.to(g32.device());

    // torch::optim::AdamW::step, line by line.
    if (p.weight_decay != 0) p32.mul_(1 - p.lr * p.weight_decay);
    m32.mul_(p.beta1).add_(g32, 1 - p.beta1);
    v32.mul_(p.beta2).addcmul_(g32, g32, 1 - p.beta2);
    at::Tensor denom = (v32.sqrt() / bias_correction2_sqrt).add_(p.eps);
    p32.addcdiv_(m32, denom, -step_size);

    // Write back (no-ops when the storage is fp32 and .to() returned the tensor itself).
    if (!p32.is_same(stored_p)) stored_p.copy_(p32);
    if (!m32.is_same(exp_avg[i])) exp_avg[i].copy_(m32);
    if (!v32.is_same(exp_avg_sq[i])) exp_avg_sq[i].copy_(v32);
    if (master != nullptr) params[i].copy_(p32);  // the bf16 model copy: the master rounded to nearest even
  }
}

at::Tensor global_grad_norm_ref(const std::vector<at::Tensor>& grads) {
  at::Tensor total;
  for (const at::Tensor& g : grads) {
    if (!g.defined()) continue;
    at::Tensor ss = g.to(at::kFloat).square().sum();
    total = total.defined() ? total + ss : ss;
  }
  if (!total.defined()) return at::zeros({}, at::kFloat);
  return total.sqrt();
}

}  // namespace vlatune::kernels
