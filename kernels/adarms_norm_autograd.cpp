// adaRMS's torch entry point (contract: fused_ops.h): input checks, dispatch by path and device (adarms_norm.cu's
// kernels on CUDA, else the reference forward with its analytic backward), the autograd node.
#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <utility>

#include "kernels/adarms_norm.h"
#include "kernels/fused_ops.h"
#include "kernels/op_support.h"

namespace vlatune::kernels {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Row stride (elements) of a [B, 1, W] view whose last dim is contiguous; -1 when the kernels cannot read it.
int64_t batch_stride(const at::Tensor& t) {
  if (t.dim() != 3 || t.size(1) != 1 || t.stride(2) != 1 || !aligned16(t) || (t.stride(0) * t.element_size()) % 16)
    return -1;
  return t.stride(0);
}

struct AdaRmsNormFn : public torch::autograd::Function<AdaRmsNormFn> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x_in, const std::optional<at::Tensor>& delta_in,
                               const std::optional<at::Tensor>& gate_in, const at::Tensor& scale_in,
                               const at::Tensor& shift_in, double eps) {
    const at::Tensor x = dense(x_in), delta = dense(delta_in.value_or(at::Tensor()));
    at::Tensor gate = delta.defined() ? gate_in.value_or(at::Tensor()) : at::Tensor(), scale = scale_in,
               shift = shift_in;
    const int64_t batch = x.size(0), tokens = x.size(1), width = x.size(2);
    const bool kernel = fused_kernels_apply(x) && adarms_norm_supported(act_dtype(x), width);
    at::Tensor h, y, rstd;
    if (kernel) {
#ifdef VLATUNE_HAVE_CUDA
      // The modulation views are read in place when their rows are 16-byte aligned; else made contiguous.
      if (batch_stride(scale) < 0 || batch_stride(shift) < 0) scale = scale.contiguous(), shift = shift.contiguous();
      if (gate.defined() && batch_stride(gate) < 0) gate = gate.contiguous();
      const c10::cuda::CUDAGuard guard(x.device());
      y = at::empty_like(x);
      h = delta.defined() ? at::empty_like(x) : x;
      rstd = at::empty({batch * tokens}, x.options().dtype(at::kFloat));
      AdaRmsNormFwdParams p;
      p.dtype = act_dtype(x);
      p.batch = batch;
      p.tokens = tokens;
      p.width = width;
      p.x = x.const_data_ptr();
      p.delta = delta.defined() ? delta.const_data_ptr() : nullptr;
      p.gate = gate.defined() ? gate.const_data_ptr() : nullptr;
      p.gate_stride = gate.defined() ? gate.stride(0) : 0;
      p.scale = scale.const_data_ptr();
      p.shift = shift.const_data_ptr();
      p.mod_stride = scale.stride(0);
      if (shift.stride(0) != scale.stride(0)) {
        scale = scale.contiguous(), shift = shift.contiguous();
        p.scale = scale.const_data_ptr(), p.shift = shift.const_data_ptr(), p.mod_stride = width;
      }
      p.eps = static_cast<float>(eps);
      p.h = delta.defined() ? h.data_ptr() : nullptr;
      p.y = y.data_ptr();
      p.rstd = rstd.data_ptr<float>();
      launch_adarms_norm_fwd(p, stream_of(x));
#endif
    } else {
      RmsRef r = adarms_norm_ref_stats(x, delta, gate, scale, shift, eps);
      h = r.h;
      y = r.y;
      rstd = r.rstd.reshape({batch * tokens});
    }
    ctx->saved_data["kernel"] = kernel;
    ctx->saved_data["has_delta"] = delta.defined();
    // h is not saved: the backward recomputes it from x, delta and gate (x is saved by the previous norm anyway).
    ctx->save_for_backward({x, delta, gate, scale, rstd});
    if (delta.defined()) return {h, y};
    return {y};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const bool has_delta = ctx->saved_data["has_delta"].toBool();
    const bool kernel = ctx->saved_data["kernel"].toBool();
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &delta = saved[1], &gate = saved[2], &scale = saved[3], &rstd = saved[4];
    const at::Tensor grad_h = has_delta ? dense(grads[0]) : at::Tensor();
    at::Tensor grad_y = has_delta ? grads[1] : grads[0];
    if (!grad_y.defined()) grad_y = at::zeros_like(x);
    grad_y = dense(grad_y);
    const int64_t batch = x.size(0), tokens = x.size(1), width = x.size(2);
    at::Tensor grad_x, grad_delta, grad_gate, grad_scale, grad_shift;
    if (kernel) {
#ifdef VLATUNE_HAVE_CUDA
      const c10::cuda::CUDAGuard guard(x.device());
      const int64_t splits = adarms_norm_bwd_splits(tokens);
      at::Tensor partials = at::empty({splits, batch, 3, width}, x.options().dtype(at::kFloat));
      grad_x = at::empty_like(x);
      if (has_delta) grad_delta = at::empty_like(x);
      AdaRmsNormBwdParams p;
      p.dtype = act_dtype(x);
      p.batch = batch;
      p.tokens = tokens;
      p.width = width;
      p.grad_y = grad_y.const_data_ptr();
      p.grad_h = grad_h.defined() ? grad_h.const_data_ptr() : nullptr;
      p.x = x.const_data_ptr();
      p.delta = has_delta ? delta.const_data_ptr() : nullptr;
      p.gate = has_delta ? gate.const_data_ptr() : nullptr;
      p.gate_stride = has_delta ? gate.stride(0) : 0;
      p.scale = scale.const_data_ptr();
      p.mod_stride = scale.stride(0);
      p.rstd = rstd.const_data_ptr<float>();
      p.grad_x = grad_x.data_ptr();
      p.grad_delta = has_delta ? grad_delta.data_ptr() : nullptr;
      p.partials = partials.data_ptr<float>();
      launch_adarms_norm_bwd(p, stream_of(x));
      // [B, 3, 1, W] in the modulation's dtype, one kernel (the gate slot holds no sum without delta: unused).
      const bool one_dtype = !has_delta || gate.scalar_type() == scale.scalar_type();
      auto sums = one_dtype ? sum_partials(partials, scale.scalar_type()).unsqueeze(2) : partials.sum(0).unsqueeze(2);
      grad_scale = sums.select(1, 0).to(scale.scalar_type());
      grad_shift = sums.select(1, 1).to(scale.scalar_type());
      if (has_delta) grad_gate = sums.select(1, 2).to(gate.scalar_type());
#endif
    } else {
      const auto md = math_of(x);
      at::Tensor h = has_delta ? x + gate.to(x.scalar_type()) * delta : x;  // the forward's h, recomputed
      const RmsBackwardRef b = rms_norm_backward_ref(h, rstd, grad_y, grad_h, scale);
      grad_x = b.dh.to(x.scalar_type());
      grad_scale = (b.gy * b.n).sum(1, /*keepdim=*/true).to(scale.scalar_type());
      grad_shift = b.gy.sum(1, /*keepdim=*/true).to(scale.scalar_type());
      if (has_delta) {
        // d(gate * delta): the gradient of the product is grad_x (as stored, in the activation dtype).
        auto gx = grad_x.to(md);
        grad_delta = (gx * gate.to(md)).to(x.scalar_type());
        grad_gate = (gx * delta.to(md)).sum(1, /*keepdim=*/true).to(gate.scalar_type());
      }
    }
    // Inputs: x, delta, gate, scale, shift, eps.
    return {grad_x, grad_delta, grad_gate, grad_scale, grad_shift, at::Tensor()};
  }
};

}  // namespace

NormOutputs adarms_norm_residual(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& gate,
                                 const at::Tensor& scale, const at::Tensor& shift, double eps, OpPath path) {
  const std::string op = "adarms_norm_residual";
  if (!x.defined() || x.dim() != 3 || !at::isFloatingType(x.scalar_type()))
    fail(op, "x must be a floating [B, T, width] tensor", x);
  check_like(op, "delta", delta, x);
  const std::vector<int64_t> mod_shape = {x.size(0), 1, x.size(2)};
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor&>{"scale", scale}, {"shift", shift}}) {
    if (!t.defined() || t.sizes() != at::IntArrayRef(mod_shape) || t.scalar_type() != x.scalar_type())
      fail(op, std::string(name) + " must be [B, 1, width] in x's dtype", t);
  }
  if (delta.defined() && (!gate.defined() || gate.sizes() != at::IntArrayRef(mod_shape)))
    fail(op, "gate must be [B, 1, width] when delta is given", gate);
  if (path == OpPath::kReference) return adarms_norm_residual_ref(x, delta, gate, scale, shift, eps);
  auto out = AdaRmsNormFn::apply(x, optional_tensor(delta), delta.defined() ? optional_tensor(gate) : std::nullopt,
                                 scale, shift, eps);
  if (delta.defined()) return {out[0], out[1]};
  return {x, out[0]};
}

}  // namespace vlatune::kernels
