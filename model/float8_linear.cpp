// FP8 Linear: autograd functions over the fused quantization (kernels/fp8_ops.h) and at::_scaled_mm. Contract and
// design: float8_linear.h, kernels/fp8.md.
#include "model/float8_linear.h"

#include <algorithm>
#include <optional>
#include <stdexcept>

#include "kernels/fp8_ops.h"
#include "kernels/fused_ops.h"
#include "profiler/scope.h"

namespace vlatune::model {

namespace {

using kernels::Fp8Format;
using kernels::Fp8QuantOutputs;
using kernels::Fp8Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

int64_t padded(int64_t m) {
  return (m + 15) / 16 * 16;
}

// [m, k] -> [mp, k], zero rows appended (exact: they add nothing to dW and their outputs are dropped).
at::Tensor pad_rows(const at::Tensor& x2, int64_t mp) {
  if (x2.size(0) == mp) return x2.contiguous();
  return at::constant_pad_nd(x2, {0, 0, 0, mp - x2.size(0)}).contiguous();
}

// An activation or gradient quantized with its role's scaling (current, or delayed from the amax history).
Fp8Tensor quantize_role(const at::Tensor& x2, Fp8Format format, Fp8AmaxHistory& h, const Fp8Config& config,
                        bool row_major, bool transposed) {
  if (config.scaling == Fp8Scaling::kCurrent) return kernels::fp8_quantize(x2, format, row_major, transposed);
  const int64_t len = std::max<int64_t>(2, config.amax_history);
  const auto f32 = x2.options().dtype(at::kFloat);
  if (!h.amax.defined() || h.amax.device() != x2.device() || h.amax.numel() != len) {
    h.amax = at::zeros({len}, f32);
    h.uses = 0;
  }
  const int64_t slot = h.uses % len;
  const at::Tensor current = h.amax.narrow(0, slot, 1);
  current.zero_();
  const auto q8 = x2.options().dtype(kernels::fp8_dtype(format));
  Fp8Tensor t;
  t.inv_scale = at::empty({}, f32);
  t.amax_used = at::empty({1}, f32);
  Fp8QuantOutputs o;
  if (row_major) t.data = o.out = at::empty({x2.size(0), x2.size(1)}, q8);
  if (transposed) t.data_t = o.out_t = at::empty({x2.size(1), x2.size(0)}, q8);
  o.inv_scale = t.inv_scale;
  o.amax_used = t.amax_used;
  if (h.uses == 0) {
    // Nothing recorded yet: current scaling, and the amax starts the history.
    kernels::fp8_amax_into(x2, current);
    kernels::fp8_quantize_into(x2, format, current, -1, o);
  } else {
    // One pass: the scale from the other entries of the history, this amax into the current slot.
    o.amax_out = current;
    kernels::fp8_quantize_into(x2, format, h.amax, slot, o);
  }
  ++h.uses;
  return t;
}

struct QuantWeights {
  at::Tensor data;    // [N, K] row-major (B of the forward GEMM as data.t())
  at::Tensor data_t;  // [K, N] row-major (B of the input-gradient GEMM as data_t.t())
  at::Tensor inv_scale, amax;
};

// The row-stacked weights [W_0; W_1; ...] in e4m3 with one (current) scale; `amax` given: reuse it (the backward
// reuses the forward's, the weights being unchanged in between).
QuantWeights quantize_weights(at::TensorList weights, const at::Tensor& amax, bool row_major, bool transposed) {
  const int64_t k = weights[0].size(1);
  int64_t n = 0;
  for (const at::Tensor& w : weights) n += w.size(0);
  const auto f32 = weights[0].options().dtype(at::kFloat);
  const auto q8 = weights[0].options().dtype(at::kFloat8_e4m3fn);
  QuantWeights q;
  q.amax = amax;
  if (!q.amax.defined()) {
    q.amax = at::zeros({1}, f32);
    for (const at::Tensor& w : weights) kernels::fp8_amax_into(w, q.amax);
  }
  q.inv_scale = at::empty({}, f32);
  if (row_major) q.data = at::empty({n, k}, q8);
  if (transposed) q.data_t = at::empty({k, n}, q8);
  int64_t offset = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    const at::Tensor w = weights[i].contiguous();
    const int64_t rows = w.size(0);
    Fp8QuantOutputs o;
    if (row_major) o.out = q.data.narrow(0, offset, rows);
    if (transposed) o.out_t = q.data_t.narrow(1, offset, rows);
    if (i == 0) o.inv_scale = q.inv_scale;
    kernels::fp8_quantize_into(w, Fp8Format::kE4m3, q.amax, -1, o);
    offset += rows;
  }
  return q;
}

at::ScalarType grad_dtype(const at::Tensor& w) {
  return w.scalar_type() == at::kFloat || w.scalar_type() == at::kBFloat16 ? w.scalar_type() : at::kFloat;
}

Float8State& state_of(AutogradContext* ctx) {
  // The state belongs to a module of the model, which outlives every graph built from it.
  return *reinterpret_cast<Float8State*>(ctx->saved_data["state"].toInt());
}

// args = [x, w_0 .. w_{n-1}].
struct Float8LinearFn : public torch::autograd::Function<Float8LinearFn> {
  static at::Tensor forward(AutogradContext* ctx, at::TensorList args, int64_t state_ptr) {
    Float8State& st = *reinterpret_cast<Float8State*>(state_ptr);
    const at::Tensor& x = args[0];
    const at::TensorList weights = args.slice(1);
    const int64_t k = x.size(-1), m = x.numel() / k, mp = padded(m);
    const Fp8Tensor xq =
        quantize_role(pad_rows(x.reshape({m, k}), mp), Fp8Format::kE4m3, st.input, st.config, true, true);
    const QuantWeights wq = quantize_weights(weights, at::Tensor(), true, false);
    at::Tensor y = kernels::fp8_mm(xq.data, wq.data.t(), xq.inv_scale, wq.inv_scale, x.scalar_type(), true);
    if (mp != m) y = y.narrow(0, 0, m);
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = y.size(1);
    ctx->saved_data["state"] = state_ptr;
    ctx->saved_data["x_sizes"] = x.sizes().vec();
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    std::vector<at::Tensor> keep{xq.data_t, xq.inv_scale, wq.amax};  // x^T in FP8, not x
    keep.insert(keep.end(), weights.begin(), weights.end());
    ctx->save_for_backward(keep);
    return y.reshape(shape);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    Float8State& st = state_of(ctx);
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &xq_t = saved[0], &x_inv = saved[1], &w_amax = saved[2];
    const at::TensorList weights = at::TensorList(saved).slice(3);
    const std::vector<int64_t> x_sizes = ctx->saved_data["x_sizes"].toIntVector();
    const auto x_dtype = static_cast<at::ScalarType>(ctx->saved_data["x_dtype"].toInt());
    variable_list result(1 + weights.size() + 1);
    if (!grads[0].defined()) return result;
    const int64_t n = grads[0].size(-1), m = grads[0].numel() / n, mp = xq_t.size(1);
    const bool need_x = ctx->needs_input_grad(0);
    const Fp8Tensor gq = quantize_role(pad_rows(grads[0].reshape({m, n}), mp), Fp8Format::kE5m2, st.grad_output,
                                       st.config, need_x, true);
    if (need_x) {
      const QuantWeights wt = quantize_weights(weights, w_amax, false, true);
      at::Tensor dx = kernels::fp8_mm(gq.data, wt.data_t.t(), gq.inv_scale, wt.inv_scale, x_dtype, false);
      result[0] = (mp != m ? dx.narrow(0, 0, m) : dx).reshape(x_sizes);
    }
    int64_t offset = 0;
    for (size_t i = 0; i < weights.size(); ++i) {
      const int64_t rows = weights[i].size(0);
      if (ctx->needs_input_grad(1 + i)) {
        result[1 + i] = kernels::fp8_mm(gq.data_t.narrow(0, offset, rows), xq_t.t(), gq.inv_scale, x_inv,
                                        grad_dtype(weights[i]), false)
                            .to(weights[i].scalar_type());
      }
      offset += rows;
    }
    return result;
  }
};

// down(geglu(merged)) with the down GEMM in FP8; saves merged (as kernels::geglu_linear) and the scale of the
// GeGLU output, which the backward recomputes and re-quantizes (transposed) with that same scale.
struct Float8GegluLinearFn : public torch::autograd::Function<Float8GegluLinearFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& merged, const at::Tensor& weight, int64_t state_ptr,
                            const std::string& scope_fqn) {
    Float8State& st = *reinterpret_cast<Float8State*>(state_ptr);
    const at::Tensor act = kernels::geglu(merged);
    const int64_t f = act.size(-1), m = act.numel() / f, mp = padded(m);
    const Fp8Tensor aq =
        quantize_role(pad_rows(act.reshape({m, f}), mp), Fp8Format::kE4m3, st.input, st.config, true, false);
    at::Tensor y;
    {
      std::optional<profiler::Scope> scope;
      if (!scope_fqn.empty()) scope.emplace(scope_fqn);
      const QuantWeights wq = quantize_weights({weight}, at::Tensor(), true, false);
      y = kernels::fp8_mm(aq.data, wq.data.t(), aq.inv_scale, wq.inv_scale, act.scalar_type(), true);
      ctx->save_for_backward({merged, weight, wq.amax, aq.amax_used});
    }
    if (mp != m) y = y.narrow(0, 0, m);
    std::vector<int64_t> shape = act.sizes().vec();
    shape.back() = y.size(1);
    ctx->saved_data["state"] = state_ptr;
    return y.reshape(shape);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    Float8State& st = state_of(ctx);
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &merged = saved[0], &weight = saved[1], &w_amax = saved[2], &act_amax = saved[3];
    variable_list result(4);
    if (!grads[0].defined()) return result;
    const int64_t n = weight.size(0), f = weight.size(1), m = grads[0].numel() / n, mp = padded(m);
    const Fp8Tensor gq =
        quantize_role(pad_rows(grads[0].reshape({m, n}), mp), Fp8Format::kE5m2, st.grad_output, st.config, true, true);
    {
      // The GeGLU output recomputed, cast transposed with the forward's scale; freed after the weight gradient.
      const at::Tensor act = pad_rows(kernels::geglu(merged).reshape({m, f}), mp);
      const at::Tensor act_t = at::empty({f, mp}, act.options().dtype(at::kFloat8_e4m3fn));
      const at::Tensor act_inv = at::empty({}, act.options().dtype(at::kFloat));
      Fp8QuantOutputs o;
      o.out_t = act_t;
      o.inv_scale = act_inv;
      kernels::fp8_quantize_into(act, Fp8Format::kE4m3, act_amax, -1, o);
      result[1] = kernels::fp8_mm(gq.data_t, act_t.t(), gq.inv_scale, act_inv, grad_dtype(weight), false)
                      .to(weight.scalar_type());
    }
    const QuantWeights wt = quantize_weights({weight}, w_amax, false, true);
    at::Tensor grad_act =
        kernels::fp8_mm(gq.data, wt.data_t.t(), gq.inv_scale, wt.inv_scale, merged.scalar_type(), false);
    if (mp != m) grad_act = grad_act.narrow(0, 0, m);
    std::vector<int64_t> act_shape = merged.sizes().vec();
    act_shape.back() = f;
    result[0] = kernels::geglu_backward(grad_act.reshape(act_shape), merged);
    return result;
  }
};

void check_weight(const at::Tensor& w, int64_t k) {
  if (!w.defined() || w.dim() != 2 || w.size(1) != k)
    throw std::invalid_argument("float8_linear: every weight must be [out, " + std::to_string(k) + "]");
  const std::string problem = float8_shape_problem(w.size(1), w.size(0));
  if (!problem.empty()) throw std::invalid_argument("float8_linear: " + problem);
}

}  // namespace

std::string float8_shape_problem(int64_t in_features, int64_t out_features) {
  if (in_features % 16 != 0)
    return "in_features " + std::to_string(in_features) + " is not a multiple of 16 (FP8 GEMMs need K % 16 == 0)";
  if (out_features % 16 != 0)
    return "out_features " + std::to_string(out_features) + " is not a multiple of 16 (FP8 GEMMs need N % 16 == 0)";
  return {};
}

torch::Tensor float8_linear(const torch::Tensor& x, const std::vector<torch::Tensor>& weights,
                            const torch::Tensor& bias, Float8State& state) {
  if (weights.empty()) throw std::invalid_argument("float8_linear: no weights");
  if (!x.defined() || x.dim() < 1 || !at::isFloatingType(x.scalar_type()))
    throw std::invalid_argument("float8_linear: x must be a floating tensor");
  for (const at::Tensor& w : weights) check_weight(w, x.size(-1));
  if (bias.defined() && weights.size() != 1)
    throw std::invalid_argument("float8_linear: a bias only with a single weight");
  std::vector<at::Tensor> args{x};
  args.insert(args.end(), weights.begin(), weights.end());
  at::Tensor y = Float8LinearFn::apply(at::TensorList(args), reinterpret_cast<int64_t>(&state));
  if (bias.defined()) y = y + (bias.scalar_type() == y.scalar_type() ? bias : bias.to(y.scalar_type()));
  return y;
}

torch::Tensor float8_geglu_linear(const torch::Tensor& merged, const torch::Tensor& weight, Float8State& state,
                                  const std::string& scope_fqn) {
  if (!merged.defined() || merged.size(-1) % 2 != 0)
    throw std::invalid_argument("float8_geglu_linear: merged must be [..., 2F]");
  check_weight(weight, merged.size(-1) / 2);
  return Float8GegluLinearFn::apply(merged, weight, reinterpret_cast<int64_t>(&state), scope_fqn);
}

}  // namespace vlatune::model
