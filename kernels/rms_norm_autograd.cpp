// RMSNorm's torch entry point (contract: fused_ops.h): input checks, dispatch by path and device (rms_norm.cu's
// kernels on CUDA, else the reference forward with its analytic backward), the autograd node.
#include <torch/torch.h>

#include <cstdint>
#include <optional>

#include "kernels/fused_ops.h"
#include "kernels/norm_support.h"
#include "kernels/op_support.h"
#include "kernels/rms_norm.h"

namespace vlatune::kernels {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct RmsNormFn : public torch::autograd::Function<RmsNormFn> {
  // Optional inputs travel as std::optional: a custom function rejects undefined tensor arguments.
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x_in, const std::optional<at::Tensor>& delta_in,
                               const at::Tensor& weight, double eps) {
    const at::Tensor x = dense(x_in), delta = dense(delta_in.value_or(at::Tensor()));
    const int64_t width = x.size(-1), rows = x.numel() / std::max<int64_t>(width, 1);
    at::Tensor h, y, rstd;
    const bool kernel = fused_kernels_apply(x) && rms_norm_supported(act_dtype(x), width);
    if (kernel) {
#ifdef VLATUNE_HAVE_CUDA
      const c10::cuda::CUDAGuard guard(x.device());
      // The weight as it is, or an fp32 copy when it is in another dtype (kept for the backward: one cast).
      const at::Tensor w32 = param_in_act_dtype(weight, x) ? at::Tensor() : weight.to(at::kFloat).contiguous();
      y = at::empty_like(x);
      h = delta.defined() ? at::empty_like(x) : x;
      rstd = at::empty({rows}, x.options().dtype(at::kFloat));
      RmsNormFwdParams p;
      p.dtype = act_dtype(x);
      p.rows = rows;
      p.width = width;
      p.x = x.const_data_ptr();
      p.delta = delta.defined() ? delta.const_data_ptr() : nullptr;
      set_weight(p, weight, w32);
      p.eps = static_cast<float>(eps);
      p.h = delta.defined() ? h.data_ptr() : nullptr;
      p.y = y.data_ptr();
      p.rstd = rstd.data_ptr<float>();
      launch_rms_norm_fwd(p, stream_of(x));
      ctx->saved_data["w32"] = w32;
#endif
    } else {
      RmsRef r = rms_norm_ref_stats(x, delta, weight, eps);
      h = r.h;
      y = r.y;
      rstd = r.rstd.reshape({rows});
    }
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["kernel"] = kernel;
    ctx->saved_data["has_delta"] = delta.defined();
    ctx->save_for_backward({h, weight, rstd});
    // h is an output even without delta (then it is x, returned as a view): whatever reads the residual stream
    // through it sends its gradient here as grad_h, which the backward kernel adds in place of an engine add.
    return {h, y};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const bool has_delta = ctx->saved_data["has_delta"].toBool();
    const bool kernel = ctx->saved_data["kernel"].toBool();
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &h = saved[0], &weight = saved[1], &rstd = saved[2];
    const auto [grad_h, grad_y, width, rows] = norm_bwd_inputs(grads, h);
    at::Tensor grad_x, grad_w;
    if (kernel) {
#ifdef VLATUNE_HAVE_CUDA
      const c10::cuda::CUDAGuard guard(h.device());
      const at::Tensor w32 = ctx->saved_data["w32"].toTensor();
      grad_x = at::empty_like(h);
      at::Tensor partials = at::empty({rms_norm_bwd_blocks(rows), width}, h.options().dtype(at::kFloat));
      RmsNormBwdParams p;
      fill_norm_bwd(p, {grad_h, grad_y, width, rows}, h, weight, w32, rstd, grad_x, partials);
      launch_rms_norm_bwd(p, stream_of(h));
      grad_w = sum_partials(partials, weight.scalar_type());
#endif
    } else {
      // dw = sum over rows of grad_y * n.
      const RmsBackwardRef b = rms_norm_backward_ref(h, rstd, grad_y, grad_h, weight);
      grad_x = b.dh.to(h.scalar_type());
      grad_w = (b.gy * b.n).reshape({rows, width}).sum(0).to(weight.scalar_type());
    }
    // Inputs: x, delta, weight, eps. h = x + delta: both receive the total gradient of h.
    return {grad_x, has_delta ? grad_x : at::Tensor(), grad_w, at::Tensor()};
  }
};

}  // namespace

NormOutputs rms_norm_residual(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight, double eps,
                              OpPath path) {
  const std::string op = "rms_norm_residual";
  if (!x.defined() || x.dim() < 1 || !at::isFloatingType(x.scalar_type())) fail(op, "x must be a floating tensor", x);
  check_like(op, "delta", delta, x);
  if (!weight.defined() || weight.dim() != 1 || weight.size(0) != x.size(-1) || weight.device() != x.device())
    fail(op, "weight must be [" + std::to_string(x.size(-1)) + "] on " + x.device().str(), weight);
  if (path == OpPath::kReference) return rms_norm_residual_ref(x, delta, weight, eps);
  auto out = RmsNormFn::apply(x, optional_tensor(delta), weight, eps);
  return {out[0], out[1]};
}

}  // namespace vlatune::kernels
