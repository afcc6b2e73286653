// GELU's torch entry points (contract: fused_ops.h): input checks, dispatch by device (gelu.cu's kernels on CUDA,
// else ATen's gelu and gelu_backward), and gelu_linear's node (SigLIP's GELU and fc2, the GELU output rebuilt in
// backward).
#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <stdexcept>

#include "kernels/fused_ops.h"
#include "kernels/gelu.h"
#include "kernels/op_support.h"

namespace vlatune::kernels {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

bool gelu_kernel(const at::Tensor& x) {
  return fused_kernels_apply(x) && gelu_supported(act_dtype(x), x.numel());
}

at::Tensor gelu_fwd(const at::Tensor& x_in) {
  if (!gelu_kernel(x_in)) return gelu_ref(x_in);
  at::Tensor out;
#ifdef VLATUNE_HAVE_CUDA
  const at::Tensor x = dense(x_in);
  out = at::empty_like(x);
  const c10::cuda::CUDAGuard guard(x.device());
  GeluParams p;
  p.dtype = act_dtype(x);
  p.numel = x.numel();
  p.x = x.const_data_ptr();
  p.out = out.data_ptr();
  launch_gelu_fwd(p, stream_of(x));
#endif
  return out;
}

// grad_x of gelu_tanh at x; with rebuild (kernel only, grad contiguous and aligned), gelu(x) is written over grad.
at::Tensor gelu_bwd(at::Tensor& grad, const at::Tensor& x_in, bool rebuild) {
  if (!gelu_kernel(x_in) || grad.sizes() != x_in.sizes()) return at::gelu_backward(grad, x_in, "tanh");
  at::Tensor out;
#ifdef VLATUNE_HAVE_CUDA
  const at::Tensor x = dense(x_in);
  if (rebuild && (!grad.is_contiguous() || !aligned16(grad)))
    throw std::logic_error("gelu backward: rebuilding the activation needs a dense gradient");
  const at::Tensor g = dense(grad);
  const c10::cuda::CUDAGuard guard(x.device());
  out = at::empty_like(x);
  GeluParams p;
  p.dtype = act_dtype(x);
  p.numel = x.numel();
  p.x = x.const_data_ptr();
  p.grad_out = g.const_data_ptr();
  p.out = out.data_ptr();
  p.act_out = rebuild ? grad.data_ptr() : nullptr;
  launch_gelu_bwd(p, stream_of(x));
#else
  (void)rebuild;
#endif
  return out;
}

// fc2(gelu(pre)): saves pre; the backward kernel writes grad_pre and rebuilds gelu(pre) over grad_act.
struct GeluLinearFn : public torch::autograd::Function<GeluLinearFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& pre, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias_in, const std::string& scope_fqn) {
    const at::Tensor bias = bias_in.value_or(at::Tensor());
    const at::Tensor act = gelu_fwd(pre);
    ctx->save_for_backward({pre, weight, bias});
    return linear_in_scope(act, weight, bias, scope_fqn);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &pre = saved[0], &weight = saved[1], &bias = saved[2];
    variable_list result(4);
    if (!grads[0].defined()) return result;
    const int64_t out_features = weight.size(0), f = weight.size(1);
    const at::Tensor g = grads[0].reshape({-1, out_features});
    // A frozen weight (or bias) gets no gradient, and then the GELU output is not rebuilt for it.
    const bool want_pre = ctx->needs_input_grad(0), want_w = ctx->needs_input_grad(1);
    const bool want_b = bias.defined() && ctx->needs_input_grad(2);
    at::Tensor act;
    if (want_pre) {
      at::Tensor grad_act = at::mm(g, cast_like(weight, g)).view(pre.sizes());
      if (want_w) {
        GeluGrads r = gelu_backward_rebuild(grad_act, pre);
        result[0] = std::move(r.grad_x);
        act = std::move(r.act);
      } else {
        result[0] = gelu_bwd(grad_act, pre, /*rebuild=*/false);
      }
    }
    if (want_w && !act.defined()) act = gelu_fwd(pre);
    if (want_w || want_b)
      std::tie(result[1], result[2]) =
          linear_param_grads(g, want_w ? act.reshape({-1, f}) : at::Tensor(), weight, bias, want_w, want_b);
    return result;
  }
};

}  // namespace

at::Tensor gelu(const at::Tensor& x) {
  if (!x.defined()) fail("gelu", "x must be defined", x);
  return gelu_fwd(x);
}

at::Tensor gelu_backward(at::Tensor& grad, const at::Tensor& x, bool rebuild_act) {
  if (!x.defined() || !grad.defined() || grad.sizes() != x.sizes())
    fail("gelu_backward", "grad must match x (" + describe(x) + ")", grad);
  return gelu_bwd(grad, x, rebuild_act && gelu_kernel(x));
}

GeluGrads gelu_backward_rebuild(at::Tensor& grad, const at::Tensor& x) {
  if (!x.defined() || !grad.defined() || grad.sizes() != x.sizes())
    fail("gelu_backward_rebuild", "grad must match x (" + describe(x) + ")", grad);
  GeluGrads r;
  if (gelu_kernel(x) && grad.is_contiguous() && aligned16(grad)) {
    r.grad_x = gelu_bwd(grad, x, /*rebuild=*/true);  // gelu(x) over the consumed gradient
    r.act = grad;
  } else {
    r.grad_x = gelu_bwd(grad, x, /*rebuild=*/false);
    r.act = gelu_fwd(x);
  }
  return r;
}

at::Tensor gelu_linear(const at::Tensor& pre, const at::Tensor& weight, const at::Tensor& bias,
                       const std::string& scope_fqn) {
  const std::string op = "gelu_linear";
  if (!pre.defined() || pre.dim() < 1) fail(op, "pre must be [..., F]", pre);
  if (!weight.defined() || weight.dim() != 2 || weight.size(1) != pre.size(-1))
    fail(op, "weight must be [out, " + std::to_string(pre.size(-1)) + "]", weight);
  return GeluLinearFn::apply(pre, weight, optional_tensor(bias), scope_fqn);
}

}  // namespace vlatune::kernels
