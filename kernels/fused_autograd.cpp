// Autograd wrappers of the fused decoder kernels (contract: fused_ops.h; design: fused.md): input checks, dispatch
// by device (CUDA kernels of norm.cu / rope.cu / geglu.cu, else the ATen reference forward with its analytic
// backward), the GEMM wrappers (merged_linear, geglu_linear, gelu_linear; their GEMMs are gemm_tuned.h's: tuned on
// CUDA bf16/fp16, the same ATen ops as before elsewhere or with VLATUNE_GEMM_TUNING=0)
// and the view split of SigLIP's merged QKV output (split_qkv_heads).
#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "kernels/env_switch.h"
#include "kernels/fused.h"
#include "kernels/fused_ops.h"
#include "kernels/gemm_tuned.h"
#include "kernels/merged_rebuild_node.h"
#include "profiler/scope.h"

#ifdef VLATUNE_HAVE_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace vlatune::kernels {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::ScalarType math_of(const at::Tensor& t) {
  return t.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

std::string describe(const at::Tensor& t) {
  if (!t.defined()) return "an undefined tensor";
  std::ostringstream os;
  os << c10::toString(t.scalar_type()) << " " << t.sizes() << " on " << t.device();
  return os.str();
}

[[noreturn]] void fail(const std::string& op, const std::string& what, const at::Tensor& t) {
  throw std::invalid_argument(op + ": " + what + ", got " + describe(t));
}

void check_like(const std::string& op, const char* name, const at::Tensor& t, const at::Tensor& x) {
  if (!t.defined()) return;
  if (t.sizes() != x.sizes() || t.scalar_type() != x.scalar_type() || t.device() != x.device())
    fail(op, std::string(name) + " must match x (" + describe(x) + ")", t);
}

bool aligned16(const at::Tensor& t) {
  return !t.defined() || reinterpret_cast<uintptr_t>(t.const_data_ptr()) % 16 == 0;
}

ActDtype act_dtype(const at::Tensor& t) {
  return t.scalar_type() == at::kBFloat16 ? ActDtype::kBf16 : ActDtype::kFp32;
}

#ifdef VLATUNE_HAVE_CUDA
cudaStream_t stream_of(const at::Tensor& t) {
  return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
}
#endif

// Contiguous and 16-byte aligned (the kernels' vector accesses): a view with an odd offset is copied.
at::Tensor dense(const at::Tensor& t) {
  if (!t.defined()) return t;
  at::Tensor c = t.contiguous();
  return aligned16(c) ? c : c.clone();
}

std::optional<at::Tensor> optional(const at::Tensor& t) {
  return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
}

// [..., 1]: the shape of a per-row statistic kept for broadcasting.
std::vector<int64_t> keepdim_shape(const at::Tensor& t) {
  std::vector<int64_t> s = t.sizes().vec();
  s.back() = 1;
  return s;
}

// ------------------------------------------------------------------------------------------------ RMSNorm

// A residual norm node's incoming gradients: of h (the residual stream output; undefined when unused) and of y (the
// norm output; zeros when unused), both dense, with h's width and rows.
struct NormBwdInputs {
  at::Tensor grad_h, grad_y;
  int64_t width, rows;
};
NormBwdInputs norm_bwd_inputs(const variable_list& grads, const at::Tensor& h) {
  const int64_t width = h.size(-1);
  return {dense(grads[0]), dense(grads[1].defined() ? grads[1] : at::zeros_like(h)), width,
          h.numel() / std::max<int64_t>(width, 1)};
}

#ifdef VLATUNE_HAVE_CUDA
// True when a norm kernel reads parameter `t` as it is: in the activation dtype of `x`, dense and 16-byte aligned.
// Otherwise the kernel reads an fp32 copy (fp32-master: fp32 parameters, bf16 activations).
bool param_in_act_dtype(const at::Tensor& t, const at::Tensor& x) {
  return t.scalar_type() == x.scalar_type() && t.is_contiguous() && aligned16(t);
}

// Points a norm kernel at its weight: the fp32 copy `w32` when the forward made one, else `weight` itself
// (param_in_act_dtype).
template <typename Params>
void set_weight(Params& p, const at::Tensor& weight, const at::Tensor& w32) {
  p.weight = w32.defined() ? w32.const_data_ptr<float>() : nullptr;
  p.weight_t = w32.defined() ? nullptr : weight.const_data_ptr();
}

// The fields the RMSNorm and LayerNorm backward kernels share (w32 as for set_weight).
template <typename Params>
void fill_norm_bwd(Params& p, const NormBwdInputs& in, const at::Tensor& h, const at::Tensor& weight,
                   const at::Tensor& w32, const at::Tensor& rstd, at::Tensor& grad_x, at::Tensor& partials) {
  p.dtype = act_dtype(h);
  p.rows = in.rows;
  p.width = in.width;
  p.grad_y = in.grad_y.const_data_ptr();
  p.grad_h = in.grad_h.defined() ? in.grad_h.const_data_ptr() : nullptr;
  p.h = h.const_data_ptr();
  set_weight(p, weight, w32);
  p.rstd = rstd.const_data_ptr<float>();
  p.grad_x = grad_x.data_ptr();
  p.weight_partials = partials.data_ptr<float>();
}

// partials [rows, ...] fp32 -> their sum over rows [...] in `dtype`: one kernel for bf16 and fp32 (ATen's sum and
// a cast otherwise).
at::Tensor sum_partials(const at::Tensor& partials, at::ScalarType dtype) {
  if ((dtype != at::kBFloat16 && dtype != at::kFloat) || !partials.is_contiguous()) return partials.sum(0).to(dtype);
  at::Tensor out = at::empty(partials.sizes().slice(1), partials.options().dtype(dtype));
  ColumnSumParams p;
  p.dtype = dtype == at::kBFloat16 ? ActDtype::kBf16 : ActDtype::kFp32;
  p.rows = partials.size(0);
  p.cols = out.numel();
  p.partials = partials.const_data_ptr<float>();
  p.out = out.data_ptr();
  launch_column_sums(p, stream_of(partials));
  return out;
}
#endif

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
      h = delta.defined() ? x + delta : x;
      auto hf = h.to(math_of(h));
      auto r = at::rsqrt(hf.pow(2).mean(-1, /*keepdim=*/true) + eps);
      y = (hf * r * (weight.to(hf.scalar_type()) + 1.0)).to(h.scalar_type());
      rstd = r.reshape({rows});
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
      // Analytic backward of y = n * (1 + w), n = h * rstd, rstd = (mean(h^2) + eps)^-1/2:
      // dh = rstd * (g - n * mean(g * n)) with g = grad_y * (1 + w); dw = sum over rows of grad_y * n.
      const auto md = math_of(h);
      auto r = rstd.view(keepdim_shape(h));
      auto n = h.to(md) * r;
      auto gy = grad_y.to(md);
      auto g = gy * (weight.to(md) + 1.0);
      auto dh = r * (g - n * (g * n).mean(-1, /*keepdim=*/true));
      if (grad_h.defined()) dh = dh + grad_h.to(md);
      grad_x = dh.to(h.scalar_type());
      grad_w = (gy * n).reshape({rows, width}).sum(0).to(weight.scalar_type());
    }
    // Inputs: x, delta, weight, eps. h = x + delta: both receive the total gradient of h.
    return {grad_x, has_delta ? grad_x : at::Tensor(), grad_w, at::Tensor()};
  }
};

// ------------------------------------------------------------------------------------------------ LayerNorm

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

// ------------------------------------------------------------------------------------------------ adaRMS

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
    const bool kernel = fused_kernels_apply(x) && rms_norm_supported(act_dtype(x), width);
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
      h = delta.defined() ? x + gate.to(x.scalar_type()) * delta : x;
      const auto md = math_of(h);
      auto hf = h.to(md);
      auto r = at::rsqrt(hf.pow(2).mean(-1, /*keepdim=*/true) + eps);
      y = (hf * r * (scale.to(md) + 1.0) + shift.to(md)).to(h.scalar_type());
      rstd = r.reshape({batch * tokens});
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
      auto r = rstd.view(keepdim_shape(h));
      auto n = h.to(md) * r;
      auto gy = grad_y.to(md);
      auto g = gy * (scale.to(md) + 1.0);
      auto dh = r * (g - n * (g * n).mean(-1, /*keepdim=*/true));
      if (grad_h.defined()) dh = dh + grad_h.to(md);
      grad_x = dh.to(x.scalar_type());
      grad_scale = (gy * n).sum(1, /*keepdim=*/true).to(scale.scalar_type());
      grad_shift = gy.sum(1, /*keepdim=*/true).to(scale.scalar_type());
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

// ------------------------------------------------------------------------------------------------ RoPE + QKV

struct RopeShape {
  int64_t batch, p, s, heads, kv_heads, d;
  bool prefix_q;
};

RopeShape rope_shape(const at::Tensor& qkv_prefix, const at::Tensor& qkv_suffix, int64_t heads, int64_t kv_heads,
                     bool prefix_q) {
  const std::string op = "rope_qkv";
  if (qkv_suffix.dim() != 3 || qkv_suffix.size(2) % (heads + 2 * kv_heads) != 0)
    fail(op, "qkv_suffix must be [B, S, (heads + 2 kv_heads) * head_dim]", qkv_suffix);
  RopeShape r{qkv_suffix.size(0), 0, qkv_suffix.size(1), heads, kv_heads, 0, prefix_q};
  r.d = qkv_suffix.size(2) / (heads + 2 * kv_heads);
  const int64_t prefix_cols = ((prefix_q ? heads : 0) + 2 * kv_heads) * r.d;
  if (qkv_prefix.dim() != 3 || qkv_prefix.size(0) != r.batch || qkv_prefix.size(2) != prefix_cols ||
      qkv_prefix.scalar_type() != qkv_suffix.scalar_type() || qkv_prefix.device() != qkv_suffix.device())
    fail(op,
         "qkv_prefix must be [" + std::to_string(r.batch) + ", P, " + std::to_string(prefix_cols) + "] " +
             describe(qkv_suffix).substr(0, describe(qkv_suffix).find(' ')),
         qkv_prefix);
  r.p = qkv_prefix.size(1);
  return r;
}

#ifdef VLATUNE_HAVE_CUDA
RopeQkvParams rope_params(const RopeShape& r, const at::Tensor& like, const at::Tensor& cos, const at::Tensor& sin) {
  RopeQkvParams p;
  p.dtype = act_dtype(like);
  p.batch = r.batch;
  p.prefix_len = r.p;
  p.suffix_len = r.s;
  p.heads = static_cast<int>(r.heads);
  p.kv_heads = static_cast<int>(r.kv_heads);
  p.head_dim = static_cast<int>(r.d);
  p.prefix_q = r.prefix_q;
  p.cos = cos.const_data_ptr<float>();
  p.sin = sin.const_data_ptr<float>();
  return p;
}
#endif

// Analytic backward of the reference: the transpose of the rotation, then the inverse of the split/concat.
std::pair<at::Tensor, at::Tensor> rope_qkv_bwd_ref(const RopeShape& r, const at::Tensor& gq, const at::Tensor& gk,
                                                   const at::Tensor& gv, const at::Tensor& cos, const at::Tensor& sin,
                                                   at::ScalarType dtype) {
  auto unrotate = [&](const at::Tensor& g, const at::Tensor& c, const at::Tensor& s) {
    const int64_t half = g.size(-1) / 2;
    auto gf = g.to(c.scalar_type());
    auto gu = gf.narrow(-1, 0, half), gw = gf.narrow(-1, half, half);
    return at::cat({gu * c + gw * s, gw * c - gu * s}, -1).to(dtype);
  };
  auto q = r.prefix_q ? unrotate(gq, cos, sin) : unrotate(gq, cos.narrow(2, r.p, r.s), sin.narrow(2, r.p, r.s));
  auto k = unrotate(gk, cos, sin);
  auto v = gv.to(dtype);
  // [B, h, T, D] rows [first, first + len) -> [B, len, h * D]
  auto rows = [&](const at::Tensor& t, int64_t first, int64_t len) {
    return t.narrow(2, first, len).transpose(1, 2).reshape({r.batch, len, t.size(1) * r.d});
  };
  std::vector<at::Tensor> prefix_parts;
  if (r.prefix_q) prefix_parts.push_back(rows(q, 0, r.p));
  prefix_parts.push_back(rows(k, 0, r.p));
  prefix_parts.push_back(rows(v, 0, r.p));
  auto grad_prefix = at::cat(prefix_parts, -1);
  auto grad_suffix = at::cat({rows(q, r.prefix_q ? r.p : 0, r.s), rows(k, r.p, r.s), rows(v, r.p, r.s)}, -1);
  return {grad_prefix, grad_suffix};
}

struct RopeQkvFn : public torch::autograd::Function<RopeQkvFn> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& qkv_prefix_in, const at::Tensor& qkv_suffix_in,
                               const at::Tensor& cos_in, const at::Tensor& sin_in, int64_t heads, int64_t kv_heads,
                               bool prefix_q) {
    const RopeShape r = rope_shape(qkv_prefix_in, qkv_suffix_in, heads, kv_heads, prefix_q);
    const bool kernel = fused_kernels_apply(qkv_suffix_in) && cos_in.scalar_type() == at::kFloat &&
                        rope_qkv_supported(act_dtype(qkv_suffix_in), static_cast<int>(r.d));
    ctx->saved_data["kernel"] = kernel;
    ctx->saved_data["heads"] = heads;
    ctx->saved_data["kv_heads"] = kv_heads;
    ctx->saved_data["prefix_q"] = prefix_q;
    ctx->saved_data["p"] = r.p;
    if (!kernel) {
      ctx->save_for_backward({cos_in, sin_in});
      auto out = rope_qkv_ref(qkv_prefix_in, qkv_suffix_in, cos_in, sin_in, heads, kv_heads, prefix_q);
      return {out.q, out.k, out.v};
    }
    at::Tensor q, k, v;
#ifdef VLATUNE_HAVE_CUDA
    const at::Tensor qkv_prefix = dense(qkv_prefix_in), qkv_suffix = dense(qkv_suffix_in);
    const at::Tensor cos = dense(cos_in), sin = dense(sin_in);
    ctx->save_for_backward({cos, sin});
    const c10::cuda::CUDAGuard guard(qkv_suffix.device());
    const auto opts = qkv_suffix.options();
    // Token-major buffers, returned as [B, h, T, D] views (fused_ops.h QkvHeads).
    q = at::empty({r.batch, prefix_q ? r.p + r.s : r.s, r.heads, r.d}, opts);
    k = at::empty({r.batch, r.p + r.s, r.kv_heads, r.d}, opts);
    v = at::empty({r.batch, r.p + r.s, r.kv_heads, r.d}, opts);
    RopeQkvParams p = rope_params(r, qkv_suffix, cos, sin);
    p.qkv_prefix = const_cast<void*>(qkv_prefix.const_data_ptr());  // read only in the forward
    p.qkv_suffix = const_cast<void*>(qkv_suffix.const_data_ptr());
    p.q = q.data_ptr();
    p.k = k.data_ptr();
    p.v = v.data_ptr();
    launch_rope_qkv_fwd(p, stream_of(qkv_suffix));
    q = q.transpose(1, 2);
    k = k.transpose(1, 2);
    v = v.transpose(1, 2);
#endif
    return {q, k, v};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const bool kernel = ctx->saved_data["kernel"].toBool();
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &cos = saved[0], &sin = saved[1];
    const int64_t heads = ctx->saved_data["heads"].toInt(), kv_heads = ctx->saved_data["kv_heads"].toInt();
    const bool prefix_q = ctx->saved_data["prefix_q"].toBool();
    const int64_t p_len = ctx->saved_data["p"].toInt();
    // Shapes from the gradients ([B, h, T, D]; materialized: undefined output gradients arrive as zeros).
    RopeShape r{grads[1].size(0), p_len, grads[1].size(2) - p_len, heads, kv_heads, grads[1].size(3), prefix_q};
    at::Tensor grad_prefix, grad_suffix;
    if (!kernel) {
      std::tie(grad_prefix, grad_suffix) =
          rope_qkv_bwd_ref(r, grads[0], grads[1], grads[2], cos, sin, grads[1].scalar_type());
    } else {
#ifdef VLATUNE_HAVE_CUDA
      // The kernel reads token-major gradients: no copy when they come as the forward's layout (the varlen
      // attention's and SDPA's gradients do).
      auto token_major = [](const at::Tensor& g) { return g.transpose(1, 2).contiguous(); };
      const at::Tensor gq = token_major(grads[0]), gk = token_major(grads[1]), gv = token_major(grads[2]);
      const c10::cuda::CUDAGuard guard(gk.device());
      const auto opts = gk.options();
      grad_prefix = at::empty({r.batch, r.p, ((prefix_q ? heads : 0) + 2 * kv_heads) * r.d}, opts);
      grad_suffix = at::empty({r.batch, r.s, (heads + 2 * kv_heads) * r.d}, opts);
      RopeQkvParams p = rope_params(r, gk, cos, sin);
      p.qkv_prefix = grad_prefix.data_ptr();
      p.qkv_suffix = grad_suffix.data_ptr();
      p.q = const_cast<void*>(gq.const_data_ptr());  // read only in the backward
      p.k = const_cast<void*>(gk.const_data_ptr());
      p.v = const_cast<void*>(gv.const_data_ptr());
      launch_rope_qkv_bwd(p, stream_of(gk));
#endif
    }
    // Inputs: qkv_prefix, qkv_suffix, cos, sin, heads, kv_heads, prefix_q.
    return {grad_prefix, grad_suffix, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// ------------------------------------------------------------------------------------------------ GeGLU

at::Tensor geglu_bwd_ref(const at::Tensor& grad, const at::Tensor& merged) {
  const int64_t f = merged.size(-1) / 2;
  auto gate = merged.narrow(-1, 0, f), up = merged.narrow(-1, f, f);
  return at::cat({at::gelu_backward(grad * up, gate, "tanh"), grad * at::gelu(gate, "tanh")}, -1);
}

bool geglu_kernel(const at::Tensor& merged) {
  return fused_kernels_apply(merged) && merged.size(-1) % 2 == 0 &&
         geglu_supported(act_dtype(merged), merged.size(-1) / 2);
}

at::Tensor geglu_fwd(const at::Tensor& merged_in) {
  if (!geglu_kernel(merged_in)) return geglu_ref(merged_in);
  at::Tensor out;
#ifdef VLATUNE_HAVE_CUDA
  const at::Tensor merged = dense(merged_in);
  const int64_t f = merged.size(-1) / 2;
  std::vector<int64_t> shape = merged.sizes().vec();
  shape.back() = f;
  out = at::empty(shape, merged.options());
  const c10::cuda::CUDAGuard guard(merged.device());
  GegluParams p;
  p.dtype = act_dtype(merged);
  p.rows = merged.numel() / std::max<int64_t>(2 * f, 1);
  p.features = f;
  p.merged = merged.const_data_ptr();
  p.out = out.data_ptr();
  launch_geglu_fwd(p, stream_of(merged));
#endif
  return out;
}

// act_out: when given (contiguous, [rows, F], may be grad_in itself), the kernel also writes the forward's output
// there. Only with the kernel: the caller checks geglu_kernel first.
at::Tensor geglu_bwd_impl(const at::Tensor& grad_in, const at::Tensor& merged_in, void* act_out = nullptr) {
  if (!geglu_kernel(merged_in)) return geglu_bwd_ref(grad_in, merged_in);
  at::Tensor out;
#ifdef VLATUNE_HAVE_CUDA
  const at::Tensor merged = dense(merged_in), grad = dense(grad_in);
  if (act_out != nullptr && grad.data_ptr() != grad_in.data_ptr())
    throw std::logic_error("geglu backward: act_out needs a dense gradient");
  const int64_t f = merged.size(-1) / 2;
  out = at::empty_like(merged);
  const c10::cuda::CUDAGuard guard(merged.device());
  GegluParams p;
  p.dtype = act_dtype(merged);
  p.rows = merged.numel() / std::max<int64_t>(2 * f, 1);
  p.features = f;
  p.merged = merged.const_data_ptr();
  p.grad_out = grad.const_data_ptr();
  p.out = out.data_ptr();
  p.act_out = act_out;
  launch_geglu_bwd(p, stream_of(merged));
#endif
  return out;
}

// ------------------------------------------------------------------------------------------------ GEMMs

at::Tensor cast_like(const at::Tensor& t, const at::Tensor& x) {
  return t.scalar_type() == x.scalar_type() ? t : t.to(x.scalar_type());
}

// The row-stacked parts in x's dtype: a view of packed parts (one cast at most, no copy in the compute dtype),
// else the cast parts concatenated.
at::Tensor stacked(at::TensorList parts, const at::Tensor& x) {
  if (parts.size() == 1) return cast_like(parts[0], x);
  if (const at::Tensor packed = packed_rows(parts); packed.defined()) return cast_like(packed, x);
  std::vector<at::Tensor> cast;
  cast.reserve(parts.size());
  for (const at::Tensor& w : parts) cast.push_back(cast_like(w, x));
  return at::cat(cast, 0);
}

// result[1] = dW = g^T act in the weight's dtype; with sum_in_gemm also result[2] = db = sum of g over rows from the
// same GEMM (tuned_mm_row_sums), in the bias's dtype (without it the caller has summed already).
void weight_and_bias_grads(const at::Tensor& g, const at::Tensor& act, const at::Tensor& weight, const at::Tensor& bias,
                           bool sum_in_gemm, variable_list& result) {
  if (!sum_in_gemm) {
    result[1] = tuned_mm(g.t(), act).to(weight.scalar_type());
    return;
  }
  MmRowSums r = tuned_mm_row_sums(g.t(), act);
  result[1] = r.out.to(weight.scalar_type());
  result[2] = r.row_sums.to(bias.scalar_type());
}

// VLATUNE_MERGED_WGRAD=0 (A/B runs): merged_linear's backward runs one weight-gradient GEMM per member.
bool merged_wgrad_enabled() {
  static const bool enabled = env_switch("VLATUNE_MERGED_WGRAD", true);
  return enabled;
}

// args = [x, w_0 .. w_{n-1}, b_0 .. b_{n-1} (when has_bias)].
struct MergedLinearFn : public torch::autograd::Function<MergedLinearFn> {
  static at::Tensor forward(AutogradContext* ctx, at::TensorList args, int64_t count, bool has_bias) {
    const at::Tensor& x = args[0];
    const at::Tensor weight = stacked(args.slice(1, count), x);
    const at::Tensor bias = has_bias ? stacked(args.slice(1 + count, count), x) : at::Tensor();
    ctx->saved_data["count"] = count;
    ctx->saved_data["has_bias"] = has_bias;
    std::vector<at::Tensor> keep(args.begin(), args.begin() + 1 + count);  // x and the weights, not the stack
    ctx->save_for_backward(keep);
    return tuned_linear_forward(x, weight, bias);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const int64_t count = ctx->saved_data["count"].toInt();
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::TensorList weights = at::TensorList(saved).slice(1, count);
    variable_list result(1 + count * (has_bias ? 2 : 1) + 2);
    if (!grads[0].defined()) return result;
    const int64_t k = x.size(-1), n_total = grads[0].size(-1);
    const at::Tensor g = grads[0].reshape({-1, n_total});
    if (ctx->needs_input_grad(0)) result[0] = tuned_mm(g, stacked(weights, g)).view(x.sizes());  // stack rebuilt
    const at::Tensor x2 = x.reshape({-1, k});
    // The bias gradients: with tuned GEMMs, each member's comes with its weight-gradient GEMM (the BGRADB epilogue);
    // else one reduction over the contiguous rows (three strided column reductions read the gradient at a third of
    // the bandwidth).
    const bool sums_in_gemm = has_bias && gemm_tuning_applies(g);
    const at::Tensor bias_sums = has_bias && !sums_in_gemm ? bias_grad(g, g.scalar_type()) : at::Tensor();
    // Every member's weight gradient from one GEMM over the whole gradient (each member's rows of g^T x are its dW:
    // disjoint views, as a cat's backward gives): the counterpart of the forward's one GEMM, where a GEMM per
    // member reads its strided columns of g. Not with the tuned bias-gradient epilogue (per member), nor when a
    // member needs no gradient.
    at::Tensor dw_all;
    bool all_w = !sums_in_gemm && merged_wgrad_enabled();
    for (int64_t i = 0; i < count; ++i) all_w = all_w && ctx->needs_input_grad(1 + i);
    if (all_w && count > 1) dw_all = tuned_mm(g.t(), x2);  // [sum n, k]
    int64_t offset = 0;
    for (int64_t i = 0; i < count; ++i) {
      const int64_t n = weights[i].size(0);
      const at::ScalarType dtype = weights[i].scalar_type();
      const at::Tensor gi = g.narrow(1, offset, n);  // strided columns: cuBLAS reads them in place
      const bool want_w = ctx->needs_input_grad(1 + i), want_b = has_bias && ctx->needs_input_grad(1 + count + i);
      // Disjoint views of one sum (as the members' weight gradients of a cat's backward would be).
      if (want_b && !sums_in_gemm) result[1 + count + i] = bias_sums.narrow(0, offset, n).to(dtype);
      if (dw_all.defined()) {
        result[1 + i] = dw_all.narrow(0, offset, n).to(dtype);
      } else if (sums_in_gemm && want_w && want_b) {
        MmRowSums r = tuned_mm_row_sums(gi.t(), x2);
        result[1 + i] = r.out.to(dtype);
        result[1 + count + i] = r.row_sums.to(dtype);
      } else {
        if (want_w) result[1 + i] = tuned_mm(gi.t(), x2).to(dtype);
        if (want_b && sums_in_gemm) result[1 + count + i] = gi.sum(0).to(dtype);
      }
      offset += n;
    }
    return result;
  }
};

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
    if (scope_fqn.empty())
      return tuned_linear_forward(act, cast_like(weight, act), bias.defined() ? cast_like(bias, act) : bias);
    profiler::Scope scope(scope_fqn);
    return tuned_linear_forward(act, cast_like(weight, act), bias.defined() ? cast_like(bias, act) : bias);
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
    const bool sum_in_gemm = bias.defined() && gemm_tuning_applies(g);  // the bias gradient comes with dW's GEMM
    if (bias.defined() && !sum_in_gemm) result[2] = bias_grad(g, bias.scalar_type());
    std::vector<int64_t> act_shape = merged.sizes().vec();
    act_shape.back() = f;
    at::Tensor grad_act = tuned_mm(g, cast_like(weight, g)).view(act_shape);
    at::Tensor act;
    if (geglu_kernel(merged) && grad_act.is_contiguous() && aligned16(grad_act)) {
      // One kernel: grad_merged, and the GeGLU output written over grad_act (no second forward kernel).
      result[0] = geglu_bwd_impl(grad_act, merged, grad_act.data_ptr());
      act = std::move(grad_act);
    } else {
      result[0] = geglu_bwd_impl(grad_act, merged);
      grad_act.reset();
      act = geglu_fwd(merged);  // recomputed
    }
    weight_and_bias_grads(g, act.reshape({-1, f}), weight, bias, sum_in_gemm, result);
    return result;
  }
};

// ------------------------------------------------------------------------------------------------ GELU

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
at::Tensor gelu_bwd_impl(at::Tensor& grad, const at::Tensor& x_in, bool rebuild) {
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
    if (scope_fqn.empty())
      return tuned_linear_forward(act, cast_like(weight, act), bias.defined() ? cast_like(bias, act) : bias);
    profiler::Scope scope(scope_fqn);
    return tuned_linear_forward(act, cast_like(weight, act), bias.defined() ? cast_like(bias, act) : bias);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &pre = saved[0], &weight = saved[1], &bias = saved[2];
    variable_list result(4);
    if (!grads[0].defined()) return result;
    const int64_t out_features = weight.size(0), f = weight.size(1);
    const at::Tensor g = grads[0].reshape({-1, out_features});
    const bool sum_in_gemm = bias.defined() && gemm_tuning_applies(g);  // the bias gradient comes with dW's GEMM
    if (bias.defined() && !sum_in_gemm) result[2] = bias_grad(g, bias.scalar_type());
    at::Tensor grad_act = tuned_mm(g, cast_like(weight, g)).view(pre.sizes());
    at::Tensor act;
    if (gelu_kernel(pre) && grad_act.is_contiguous() && aligned16(grad_act)) {
      result[0] = gelu_bwd_impl(grad_act, pre, /*rebuild=*/true);  // gelu(pre) over the consumed gradient
      act = std::move(grad_act);
    } else {
      result[0] = at::gelu_backward(grad_act, pre, "tanh");
      grad_act.reset();
      act = gelu_ref(pre);
    }
    weight_and_bias_grads(g, act.reshape({-1, f}), weight, bias, sum_in_gemm, result);
    return result;
  }
};

// ------------------------------------------------------------------------------------------------ QKV heads

// qkv [B, T, 3 * H * D] -> q, k, v [B, H, T, D] views. Backward: one stack of the three gradients.
struct SplitQkvFn : public torch::autograd::Function<SplitQkvFn> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& qkv, int64_t heads) {
    const int64_t batch = qkv.size(0), t = qkv.size(1), d = qkv.size(2) / (3 * heads);
    ctx->saved_data["heads"] = heads;
    ctx->saved_data["shape"] = qkv.sizes().vec();
    auto parts = qkv.view({batch, t, 3, heads, d}).unbind(2);  // [B, T, H, D] each
    return {parts[0].transpose(1, 2), parts[1].transpose(1, 2), parts[2].transpose(1, 2)};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto shape = ctx->saved_data["shape"].toIntVector();
    const int64_t heads = ctx->saved_data["heads"].toInt();
    const int64_t batch = shape[0], t = shape[1], d = shape[2] / (3 * heads);
    at::Tensor like;
    for (const auto& g : grads)
      if (g.defined()) like = g;
    if (!like.defined()) return {at::Tensor(), at::Tensor()};
    std::vector<at::Tensor> parts;
    for (const auto& g : grads)
      parts.push_back(g.defined() ? g.transpose(1, 2) : at::zeros({batch, t, heads, d}, like.options()));
    // [B, T, 3, H, D] in one copy kernel = the merged layout.
    return {at::stack(parts, 2).view({batch, t, shape[2]}), at::Tensor()};
  }
};

}  // namespace

bool fused_kernels_apply(const at::Tensor& x) {
#ifdef VLATUNE_HAVE_CUDA
  return x.is_cuda() && (x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat);
#else
  (void)x;
  return false;
#endif
}

NormOutputs rms_norm_residual(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight, double eps) {
  const std::string op = "rms_norm_residual";
  if (!x.defined() || x.dim() < 1 || !at::isFloatingType(x.scalar_type())) fail(op, "x must be a floating tensor", x);
  check_like(op, "delta", delta, x);
  if (!weight.defined() || weight.dim() != 1 || weight.size(0) != x.size(-1) || weight.device() != x.device())
    fail(op, "weight must be [" + std::to_string(x.size(-1)) + "] on " + x.device().str(), weight);
  auto out = RmsNormFn::apply(x, optional(delta), weight, eps);
  return {out[0], out[1]};
}

NormOutputs adarms_norm_residual(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& gate,
                                 const at::Tensor& scale, const at::Tensor& shift, double eps) {
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
  auto out =
      AdaRmsNormFn::apply(x, optional(delta), delta.defined() ? optional(gate) : std::nullopt, scale, shift, eps);
  if (delta.defined()) return {out[0], out[1]};
  return {x, out[0]};
}

QkvHeads rope_qkv(const at::Tensor& qkv_prefix, const at::Tensor& qkv_suffix, const at::Tensor& cos,
                  const at::Tensor& sin, int64_t heads, int64_t kv_heads, bool prefix_q) {
  const RopeShape r = rope_shape(qkv_prefix, qkv_suffix, heads, kv_heads, prefix_q);
  if (!cos.defined() || cos.dim() != 4 || cos.size(0) != r.batch || cos.size(2) != r.p + r.s ||
      cos.size(3) != r.d / 2 || !sin.defined() || sin.sizes() != cos.sizes())
    fail("rope_qkv", "cos and sin must be [B, 1, P + S, head_dim / 2]", cos);
  auto out = RopeQkvFn::apply(qkv_prefix, qkv_suffix, cos, sin, heads, kv_heads, prefix_q);
  return {out[0], out[1], out[2]};
}

NormOutputs layer_norm_residual(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight,
                                const at::Tensor& bias, double eps) {
  const std::string op = "layer_norm_residual";
  if (!x.defined() || x.dim() < 1 || !at::isFloatingType(x.scalar_type())) fail(op, "x must be a floating tensor", x);
  check_like(op, "delta", delta, x);
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor&>{"weight", weight}, {"bias", bias}}) {
    if (!t.defined() || t.dim() != 1 || t.size(0) != x.size(-1) || t.device() != x.device())
      fail(op, std::string(name) + " must be [" + std::to_string(x.size(-1)) + "] on " + x.device().str(), t);
  }
  auto out = LayerNormFn::apply(x, optional(delta), weight, bias, eps);
  return {out[0], out[1]};
}

at::Tensor gelu(const at::Tensor& x) {
  if (!x.defined()) fail("gelu", "x must be defined", x);
  return gelu_fwd(x);
}

at::Tensor gelu_backward(at::Tensor& grad, const at::Tensor& x, bool rebuild_act) {
  if (!x.defined() || !grad.defined() || grad.sizes() != x.sizes())
    fail("gelu_backward", "grad must match x (" + describe(x) + ")", grad);
  return gelu_bwd_impl(grad, x, rebuild_act && gelu_kernel(x));
}

at::Tensor gelu_linear(const at::Tensor& pre, const at::Tensor& weight, const at::Tensor& bias,
                       const std::string& scope_fqn) {
  const std::string op = "gelu_linear";
  if (!pre.defined() || pre.dim() < 1) fail(op, "pre must be [..., F]", pre);
  if (!weight.defined() || weight.dim() != 2 || weight.size(1) != pre.size(-1))
    fail(op, "weight must be [out, " + std::to_string(pre.size(-1)) + "]", weight);
  return GeluLinearFn::apply(pre, weight, optional(bias), scope_fqn);
}

QkvHeads split_qkv_heads(const at::Tensor& qkv, int64_t heads) {
  if (!qkv.defined() || qkv.dim() != 3 || heads <= 0 || qkv.size(2) % (3 * heads) != 0)
    fail("split_qkv_heads", "qkv must be [B, T, 3 * heads * head_dim] with heads = " + std::to_string(heads), qkv);
  auto out = SplitQkvFn::apply(qkv.is_contiguous() ? qkv : qkv.contiguous(), heads);
  return {out[0], out[1], out[2]};
}

at::Tensor packed_rows(at::TensorList parts) {
  if (parts.empty()) return at::Tensor();
  const at::Tensor& first = parts[0];
  if (!first.defined() || first.dim() < 1 || !first.is_contiguous() || !first.has_storage()) return at::Tensor();
  if (parts.size() == 1) return first;
  int64_t rows = 0, end = first.storage_offset();
  for (const at::Tensor& p : parts) {
    if (!p.defined() || !p.has_storage() || !p.is_contiguous() || p.dim() != first.dim() ||
        p.scalar_type() != first.scalar_type() || p.device() != first.device() ||
        !p.storage().is_alias_of(first.storage()) || p.storage_offset() != end ||
        p.sizes().slice(1) != first.sizes().slice(1))
      return at::Tensor();
    rows += p.size(0);
    end += p.numel();
  }
  std::vector<int64_t> sizes = first.sizes().vec();
  sizes[0] = rows;
  // Contiguous strides of the spanning shape (a part with a single row may carry any stride for dim 0).
  std::vector<int64_t> strides(sizes.size(), 1);
  for (int64_t d = static_cast<int64_t>(sizes.size()) - 2; d >= 0; --d) strides[d] = strides[d + 1] * sizes[d + 1];
  return first.as_strided(sizes, strides, first.storage_offset());
}

at::Tensor merged_linear(const at::Tensor& x, const std::vector<at::Tensor>& weights,
                         const std::vector<at::Tensor>& biases) {
  const std::string op = "merged_linear";
  if (weights.empty()) throw std::invalid_argument(op + ": no weights");
  if (!biases.empty() && biases.size() != weights.size())
    throw std::invalid_argument(op + ": " + std::to_string(biases.size()) + " biases for " +
                                std::to_string(weights.size()) + " weights");
  std::vector<at::Tensor> args{x};
  for (const at::Tensor& w : weights) {
    if (!w.defined() || w.dim() != 2 || w.size(1) != x.size(-1))
      fail(op, "every weight must be [out, " + std::to_string(x.size(-1)) + "]", w);
    args.push_back(w);
  }
  for (size_t i = 0; i < biases.size(); ++i) {
    if (!biases[i].defined() || biases[i].dim() != 1 || biases[i].size(0) != weights[i].size(0))
      fail(op, "bias " + std::to_string(i) + " must be [" + std::to_string(weights[i].size(0)) + "]", biases[i]);
    args.push_back(biases[i]);
  }
  return MergedLinearFn::apply(at::TensorList(args), static_cast<int64_t>(weights.size()), !biases.empty());
}

at::Tensor geglu(const at::Tensor& merged) {
  if (!merged.defined() || merged.size(-1) % 2 != 0) fail("geglu", "merged must be [..., 2F]", merged);
  return geglu_fwd(merged);
}

at::Tensor geglu_backward(const at::Tensor& grad, const at::Tensor& merged) {
  if (!merged.defined() || merged.size(-1) % 2 != 0) fail("geglu_backward", "merged must be [..., 2F]", merged);
  return geglu_bwd_impl(grad, merged);
}

at::Tensor geglu_linear(const at::Tensor& merged, const at::Tensor& weight, const at::Tensor& bias,
                        const std::string& scope_fqn, const MergedRebuild* rebuild) {
  const std::string op = "geglu_linear";
  if (!merged.defined() || merged.size(-1) % 2 != 0) fail(op, "merged must be [..., 2F]", merged);
  if (!weight.defined() || weight.dim() != 2 || weight.size(1) * 2 != merged.size(-1))
    fail(op, "weight must be [out, " + std::to_string(merged.size(-1) / 2) + "]", weight);
  return GegluLinearFn::apply(merged, weight, optional(bias), scope_fqn, rebuild_holder(rebuild, op),
                              rebuild ? at::TensorList(rebuild->saved) : at::TensorList());
}

c10::intrusive_ptr<RebuildHolder> rebuild_holder(const MergedRebuild* rebuild, const std::string& op) {
  if (rebuild == nullptr) return {};
  if (!rebuild->fn) throw std::invalid_argument(op + ": the rebuild has no function");
  auto holder = c10::make_intrusive<RebuildHolder>();
  holder->fn = rebuild->fn;
  return holder;
}

void remember_rebuild(torch::autograd::AutogradContext* ctx, const c10::intrusive_ptr<RebuildHolder>& holder) {
  if (holder) ctx->saved_data["rebuild"] = c10::IValue::make_capsule(holder);
}

at::Tensor kept_or_rebuilt(torch::autograd::AutogradContext* ctx, const std::vector<at::Tensor>& saved,
                           size_t rebuild_first) {
  if (ctx->saved_data.count("rebuild") == 0) return saved[0];
  // The merged GEMM again, at the start of this backward.
  const auto holder = c10::static_intrusive_pointer_cast<RebuildHolder>(ctx->saved_data["rebuild"].toCapsule());
  return holder->fn(std::vector<at::Tensor>(saved.begin() + static_cast<std::ptrdiff_t>(rebuild_first), saved.end()));
}

at::Tensor bias_grad(const at::Tensor& g_in, at::ScalarType dtype) {
  const int64_t n = g_in.size(-1);
  const at::Tensor g = g_in.reshape({-1, n});
#ifdef VLATUNE_HAVE_CUDA
  static const bool enabled = env_switch("VLATUNE_BIAS_GRAD_KERNEL", true);
  const bool typed = g.scalar_type() == at::kBFloat16 || g.scalar_type() == at::kFloat;
  if (enabled && g.is_cuda() && typed && g.size(0) > 0 && g.is_contiguous() && aligned16(g) &&
      bias_grad_supported(act_dtype(g), n)) {
    const c10::cuda::CUDAGuard guard(g.device());
    at::Tensor partials = at::empty({bias_grad_chunks(g.size(0), n), n}, g.options().dtype(at::kFloat));
    at::Tensor out = at::empty({n}, g.options());
    BiasGradParams p;
    p.dtype = act_dtype(g);
    p.rows = g.size(0);
    p.cols = n;
    p.g = g.const_data_ptr();
    p.partials = partials.data_ptr<float>();
    p.out = out.data_ptr();
    launch_bias_grad(p, stream_of(g));
    return out.to(dtype);
  }
#endif
  return g.sum(0).to(dtype);
}

MergedRebuild merged_linear_rebuild(const at::Tensor& x, const std::vector<at::Tensor>& weights) {
  MergedRebuild r;
  r.saved.push_back(x.detach());  // the same storage merged_linear's node keeps: no copy
  for (const at::Tensor& w : weights) r.saved.push_back(w.detach());
  r.fn = [](const std::vector<at::Tensor>& s) {
    at::NoGradGuard no_grad;
    return merged_linear(s[0], std::vector<at::Tensor>(s.begin() + 1, s.end()));
  };
  return r;
}

}  // namespace vlatune::kernels
