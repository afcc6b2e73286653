// LayerNorm's torch entry point (contract: fused_ops.h): input checks, dispatch by path and device (layer_norm.cu's
// kernels on CUDA, else ATen's native_layer_norm with the analytic backward), the autograd node.
#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <utility>

#include "kernels/fused_ops.h"
#include "kernels/layer_norm.h"
#include "kernels/norm_support.h"
#include "kernels/op_support.h"

namespace vlatune::kernels {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct LayerNormFn : public torch::autograd::Function<LayerNormFn> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x_in, const std::optional<at::Tensor>& delta_in,
                               const at::Tensor& weight, const at::Tensor& bias, double eps) {
    const at::Tensor x = dense(x_in), delta = dense(delta_in.value_or(at::Tensor()));
    const int64_t width = x.size(-1), rows = x.numel() / std::max<int64_t>(width, 1);
    at::Tensor h, y, mean, rstd;
    const bool kernel = fused_kernels_apply(x) && layer_norm_supported(act_dtype(x), width);
    if (kernel) {
#ifdef VLATUNE_HAVE_CUDA
      const c10::cuda::CUDAGuard guard(x.device());
      // The values the reference uses: the parameters cast to the activation dtype. The kernels read them as they
      // are when they are in that dtype; else fp32 copies of the cast values (the weight's kept for the backward).
      const bool in_act = param_in_act_dtype(weight, x) && param_in_act_dtype(bias, x);
      const at::Tensor w32 = in_act ? at::Tensor() : weight.to(x.scalar_type()).to(at::kFloat).contiguous();
      const at::Tensor b32 = in_act ? at::Tensor() : bias.to(x.scalar_type()).to(at::kFloat).contiguous();
      y = at::empty_like(x);
      h = delta.defined() ? at::empty_like(x) : x;
      mean = at::empty({rows}, x.options().dtype(at::kFloat));
      rstd = at::empty({rows}, x.options().dtype(at::kFloat));
      LayerNormFwdParams p;
      p.dtype = act_dtype(x);
      p.rows = rows;
      p.width = width;
      p.x = x.const_data_ptr();
      p.delta = delta.defined() ? delta.const_data_ptr() : nullptr;
      set_weight(p, weight, w32);
      p.bias = in_act ? nullptr : b32.const_data_ptr<float>();
      p.bias_t = in_act ? bias.const_data_ptr() : nullptr;
      p.eps = static_cast<float>(eps);
      p.h = delta.defined() ? h.data_ptr() : nullptr;
      p.y = y.data_ptr();
      p.mean = mean.data_ptr<float>();
      p.rstd = rstd.data_ptr<float>();
      launch_layer_norm_fwd(p, stream_of(x));
      ctx->saved_data["w32"] = w32;
#endif
    } else {
      // ATen's LayerNorm itself (the reference calls it through at::layer_norm), for its mean and rstd.
      h = delta.defined() ? x + delta : x;
      auto out = at::native_layer_norm(h, {width}, weight.to(h.scalar_type()), bias.to(h.scalar_type()), eps);
      y = std::get<0>(out);
      mean = std::get<1>(out).to(math_of(h)).reshape({rows});
      rstd = std::get<2>(out).to(math_of(h)).reshape({rows});
    }
    ctx->saved_data["kernel"] = kernel;
    ctx->saved_data["has_delta"] = delta.defined();
    ctx->save_for_backward({h, weight, bias, mean, rstd});
    return {h, y};  // h (x as a view without delta): its gradient joins in the backward kernel, as RmsNormFn's
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const bool has_delta = ctx->saved_data["has_delta"].toBool();
    const bool kernel = ctx->saved_data["kernel"].toBool();
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &h = saved[0], &weight = saved[1], &bias = saved[2], &mean = saved[3], &rstd = saved[4];
    const auto [grad_h, grad_y, width, rows] = norm_bwd_inputs(grads, h);
    at::Tensor grad_x, grad_w, grad_b;
    if (kernel) {
#ifdef VLATUNE_HAVE_CUDA
      const c10::cuda::CUDAGuard guard(h.device());
      const at::Tensor w32 = ctx->saved_data["w32"].toTensor();
      grad_x = at::empty_like(h);
      at::Tensor partials =
          at::empty({layer_norm_bwd_blocks(act_dtype(h), rows, width), 2, width}, h.options().dtype(at::kFloat));
      LayerNormBwdParams p;
      fill_norm_bwd(p, {grad_h, grad_y, width, rows}, h, weight, w32, rstd, grad_x, partials);
      p.mean = mean.const_data_ptr<float>();
      launch_layer_norm_bwd(p, stream_of(h));
      if (weight.scalar_type() == bias.scalar_type()) {
        const at::Tensor sums = sum_partials(partials, weight.scalar_type());  // [2, width]: both in one kernel
        grad_w = sums.select(0, 0);
        grad_b = sums.select(0, 1);
      } else {
        auto sums = partials.sum(0);
        grad_w = sums.select(0, 0).to(weight.scalar_type());
        grad_b = sums.select(0, 1).to(bias.scalar_type());
      }
#endif
    } else {
      // Analytic backward of y = n * w + b, n = (h - mean) * rstd:
      // dh = rstd * (g - mean(g) - n * mean(g * n)) with g = grad_y * w; dw = sum of grad_y * n, db = sum of grad_y.
      const auto md = math_of(h);
      auto n = (h.to(md) - mean.view(keepdim_shape(h))) * rstd.view(keepdim_shape(h));
      auto gy = grad_y.to(md);
      auto g = gy * weight.to(h.scalar_type()).to(md);
      auto dh =
          rstd.view(keepdim_shape(h)) * (g - g.mean(-1, /*keepdim=*/true) - n * (g * n).mean(-1, /*keepdim=*/true));
      if (grad_h.defined()) dh = dh + grad_h.to(md);
      grad_x = dh.to(h.scalar_type());
      grad_w = (gy * n).reshape({rows, width}).sum(0).to(weight.scalar_type());
      grad_b = gy.reshape({rows, width}).sum(0).to(bias.scalar_type());
    }
    // Inputs: x, delta, weight, bias, eps.
    return {grad_x, has_delta ? grad_x : at::Tensor(), grad_w, grad_b, at::Tensor()};
  }
};

}  // namespace

NormOutputs layer_norm_residual(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight,
                                const at::Tensor& bias, double eps, OpPath path) {
  const std::string op = "layer_norm_residual";
  if (!x.defined() || x.dim() < 1 || !at::isFloatingType(x.scalar_type())) fail(op, "x must be a floating tensor", x);
  check_like(op, "delta", delta, x);
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor&>{"weight", weight}, {"bias", bias}}) {
    if (!t.defined() || t.dim() != 1 || t.size(0) != x.size(-1) || t.device() != x.device())
      fail(op, std::string(name) + " must be [" + std::to_string(x.size(-1)) + "] on " + x.device().str(), t);
  }
  if (path == OpPath::kReference) return layer_norm_residual_ref(x, delta, weight, bias, eps);
  auto out = LayerNormFn::apply(x, optional_tensor(delta), weight, bias, eps);
  return {out[0], out[1]};
}

}  // namespace vlatune::kernels
