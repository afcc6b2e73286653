// GeGLU's torch entry points (contract: fused_ops.h): input checks, dispatch by device (geglu.cu's kernels on CUDA,
// else the reference and its analytic backward), and geglu_linear's node (the GeGLU and the down projection, the
// GeGLU output rebuilt in backward).
#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <vector>

#include "kernels/fused_ops.h"
#include "kernels/geglu.h"
#include "kernels/merged_rebuild_node.h"
#include "kernels/op_support.h"

namespace vlatune::kernels {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

bool geglu_kernel(const at::Tensor& merged) {
  return fused_kernels_apply(merged) && merged.size(-1) % 2 == 0 &&
         geglu_supported(act_dtype(merged), merged.size(-1) / 2);
}

#ifdef VLATUNE_HAVE_CUDA
// The fields forward and backward share, for a dense `merged` [..., 2F].
GegluParams geglu_params(const at::Tensor& merged) {
  const int64_t f = merged.size(-1) / 2;
  GegluParams p;
  p.dtype = act_dtype(merged);
  p.rows = merged.numel() / std::max<int64_t>(2 * f, 1);
  p.features = f;
  p.merged = merged.const_data_ptr();
  return p;
}
#endif

at::Tensor geglu_fwd(const at::Tensor& merged_in) {
  if (!geglu_kernel(merged_in)) return geglu_ref(merged_in);
  at::Tensor out;
#ifdef VLATUNE_HAVE_CUDA
  const at::Tensor merged = dense(merged_in);
  std::vector<int64_t> shape = merged.sizes().vec();
  shape.back() /= 2;
  out = at::empty(shape, merged.options());
  const c10::cuda::CUDAGuard guard(merged.device());
  GegluParams p = geglu_params(merged);
  p.out = out.data_ptr();
  launch_geglu_fwd(p, stream_of(merged));
#endif
  return out;
}

// act_out: when given (contiguous, [rows, F], may be grad_in itself), the kernel also writes the forward's output
// there. Only with the kernel: the caller checks geglu_kernel first.
at::Tensor geglu_bwd(const at::Tensor& grad_in, const at::Tensor& merged_in, void* act_out = nullptr) {
  if (!geglu_kernel(merged_in)) return geglu_backward_ref(grad_in, merged_in);
  at::Tensor out;
#ifdef VLATUNE_HAVE_CUDA
  const at::Tensor merged = dense(merged_in), grad = dense(grad_in);
  if (act_out != nullptr && grad.data_ptr() != grad_in.data_ptr())
    throw std::logic_error("geglu backward: act_out needs a dense gradient");
  out = at::empty_like(merged);
  const c10::cuda::CUDAGuard guard(merged.device());
  GegluParams p = geglu_params(merged);
  p.grad_out = grad.const_data_ptr();
  p.out = out.data_ptr();
  p.act_out = act_out;
  launch_geglu_bwd(p, stream_of(merged));
#else
  (void)act_out;
#endif
  return out;
}

// down(geglu(merged)): saves merged (or, with a rebuild, what rebuilds it), recomputes the GeGLU output in backward.
// rebuild_saved: the rebuild's tensors (detached: no gradient flows to them).
struct GegluLinearFn : public torch::autograd::Function<GegluLinearFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& merged, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias_in, const std::string& scope_fqn,
                            const c10::intrusive_ptr<RebuildHolder>& rebuild, at::TensorList rebuild_saved) {
    const at::Tensor bias = bias_in.value_or(at::Tensor());
    const at::Tensor act = geglu_fwd(merged);
    std::vector<at::Tensor> keep{rebuild ? at::Tensor() : merged, weight, bias};
    keep.insert(keep.end(), rebuild_saved.begin(), rebuild_saved.end());
    ctx->save_for_backward(keep);
    remember_rebuild(ctx, rebuild);
    return linear_in_scope(act, weight, bias, scope_fqn);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &weight = saved[1], &bias = saved[2];
    // Inputs: merged, weight, bias, scope_fqn, rebuild, rebuild_saved...
    variable_list result(5 + (saved.size() - 3));
    if (!grads[0].defined()) return result;
    const at::Tensor merged = kept_or_rebuilt(ctx, saved, 3);
    const int64_t out_features = weight.size(0), f = weight.size(1);
    const at::Tensor g = grads[0].reshape({-1, out_features});
    // A frozen weight (or bias) gets no gradient, and then the GeGLU output is not rebuilt for it.
    const bool want_merged = ctx->needs_input_grad(0), want_w = ctx->needs_input_grad(1);
    const bool want_b = bias.defined() && ctx->needs_input_grad(2);
    at::Tensor act;
    if (want_merged) {
      std::vector<int64_t> act_shape = merged.sizes().vec();
      act_shape.back() = f;
      at::Tensor grad_act = at::mm(g, cast_like(weight, g)).view(act_shape);
      if (want_w && geglu_kernel(merged) && grad_act.is_contiguous() && aligned16(grad_act)) {
        // One kernel: grad_merged, and the GeGLU output written over grad_act (no second forward kernel).
        result[0] = geglu_bwd(grad_act, merged, grad_act.data_ptr());
        act = std::move(grad_act);
      } else {
        result[0] = geglu_bwd(grad_act, merged);
      }
    }
    if (want_w && !act.defined()) act = geglu_fwd(merged);  // recomputed
    if (want_w || want_b)
      std::tie(result[1], result[2]) =
          linear_param_grads(g, want_w ? act.reshape({-1, f}) : at::Tensor(), weight, bias, want_w, want_b);
    return result;
  }
};

}  // namespace

at::Tensor geglu(const at::Tensor& merged) {
  if (!merged.defined() || merged.size(-1) % 2 != 0) fail("geglu", "merged must be [..., 2F]", merged);
  return geglu_fwd(merged);
}

at::Tensor geglu_backward(const at::Tensor& grad, const at::Tensor& merged) {
  if (!merged.defined() || merged.size(-1) % 2 != 0) fail("geglu_backward", "merged must be [..., 2F]", merged);
  return geglu_bwd(grad, merged);
}

at::Tensor geglu_linear(const at::Tensor& merged, const at::Tensor& weight, const at::Tensor& bias,
                        const std::string& scope_fqn, const MergedRebuild* rebuild) {
  const std::string op = "geglu_linear";
  if (!merged.defined() || merged.size(-1) % 2 != 0) fail(op, "merged must be [..., 2F]", merged);
  if (!weight.defined() || weight.dim() != 2 || weight.size(1) * 2 != merged.size(-1))
    fail(op, "weight must be [out, " + std::to_string(merged.size(-1) / 2) + "]", weight);
  return GegluLinearFn::apply(merged, weight, optional_tensor(bias), scope_fqn, rebuild_holder(rebuild, op),
                              rebuild ? at::TensorList(rebuild->saved) : at::TensorList());
}

}  // namespace vlatune::kernels
