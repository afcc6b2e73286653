// FP8 Linear: autograd functions over the fused quantization (kernels/fp8_ops.h) and at::_scaled_mm. Contract and
// design: float8_linear.h, kernels/fp8.md.
#include "model/float8_linear.h"

#include <algorithm>
#include <optional>
#include <stdexcept>

#include "kernels/fp8_ops.h"
#include "kernels/fused_ops.h"
#include "kernels/merged_rebuild_node.h"
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

// A cast with its role's scaling (current, or delayed from the amax history): `amax_pass(amax)` folds the tensor's
// max |value| into a 1-element amax; `cast(amax_in, skip, outputs)` writes the FP8 copies (a plain cast, or a fused
// GeGLU cast that computes its values on the fly).
template <typename AmaxPass, typename Cast>
Fp8Tensor quantize_role_with(int64_t rows, int64_t cols, const at::TensorOptions& options, Fp8Format format,
                             Fp8AmaxHistory& h, const Fp8Config& config, bool row_major, bool transposed,
                             const AmaxPass& amax_pass, const Cast& cast) {
  const auto f32 = options.dtype(at::kFloat);
  const auto q8 = options.dtype(kernels::fp8_dtype(format));
  Fp8Tensor t;
  t.inv_scale = at::empty({}, f32);
  t.amax_used = at::empty({1}, f32);
  Fp8QuantOutputs o;
  if (row_major) t.data = o.out = at::empty({rows, cols}, q8);
  if (transposed) t.data_t = o.out_t = at::empty({cols, rows}, q8);
  o.inv_scale = t.inv_scale;
  o.amax_used = t.amax_used;
  if (config.scaling == Fp8Scaling::kCurrent) {
    const at::Tensor amax = at::zeros({1}, f32);
    amax_pass(amax);
    cast(amax, -1, o);
    return t;
  }
  const int64_t len = std::max<int64_t>(2, config.amax_history);
  if (!h.amax.defined() || h.amax.device() != options.device() || h.amax.numel() != len) {
    h.amax = at::zeros({len}, f32);
    h.uses = 0;
  }
  const int64_t slot = h.uses % len;
  const at::Tensor current = h.amax.narrow(0, slot, 1);
  current.zero_();
  if (h.uses == 0) {
    // Nothing recorded yet: current scaling, and the amax starts the history.
    amax_pass(current);
    cast(current, -1, o);
  } else {
    // One pass: the scale from the other entries of the history, this amax into the current slot.
    o.amax_out = current;
    cast(h.amax, slot, o);
  }
  ++h.uses;
  return t;
}

// An activation or gradient x2 [rows, cols] cast with its role's scaling.
Fp8Tensor quantize_role(const at::Tensor& x2, Fp8Format format, Fp8AmaxHistory& h, const Fp8Config& config,
                        bool row_major, bool transposed) {
  return quantize_role_with(
      x2.size(0), x2.size(1), x2.options(), format, h, config, row_major, transposed,
      [&](const at::Tensor& amax) { kernels::fp8_amax_into(x2, amax); },
      [&](const at::Tensor& amax_in, int64_t skip, const Fp8QuantOutputs& o) {
        kernels::fp8_quantize_into(x2, format, amax_in, skip, o);
      });
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

// An FP8 GEMM (kernels::fp8_mm) with the state's cuBLASLt algorithm choice.
at::Tensor fp8_gemm(const Float8State& st, const at::Tensor& a, const at::Tensor& b, const at::Tensor& inv_a,
                    const at::Tensor& inv_b, at::ScalarType out_dtype, bool fast_accum, const at::Tensor& bias = {}) {
  return kernels::fp8_mm(a, b, inv_a, inv_b, out_dtype, fast_accum, bias, st.config.gemm_algorithm);
}

Float8State& state_of(AutogradContext* ctx) {
  // The state belongs to a module of the model, which outlives every graph built from it.
  return *reinterpret_cast<Float8State*>(ctx->saved_data["state"].toInt());
}

// The state of the GEMM whose output gradient a node's backward casts (its pending_grad), or 0: remembered by the
// forward, which drops a pending gradient an earlier graph left unused.
void remember_producer(AutogradContext* ctx, int64_t producer_ptr) {
  ctx->saved_data["producer"] = producer_ptr;
  if (producer_ptr != 0) reinterpret_cast<Float8State*>(producer_ptr)->pending_grad.reset();
}
Float8State* producer_of(AutogradContext* ctx) {
  return reinterpret_cast<Float8State*>(ctx->saved_data["producer"].toInt());
}

// args = [x, w_0 .. w_{n-1}] and, with `with_bias`, the members' biases concatenated last (added in the GEMM's
// epilogue). Returns {y}; with `expose`, {y, x_q^T, x's inverse scale, the weights' amax} (the saved tensors a
// MergedRebuild reads; not differentiable).
struct Float8LinearFn : public torch::autograd::Function<Float8LinearFn> {
  static variable_list forward(AutogradContext* ctx, at::TensorList args, int64_t state_ptr, bool expose,
                               bool with_bias) {
    Float8State& st = *reinterpret_cast<Float8State*>(state_ptr);
    const at::Tensor& x = args[0];
    const at::TensorList weights = args.slice(1, args.size() - 1 - (with_bias ? 1 : 0));
    const at::Tensor bias = with_bias ? args.back() : at::Tensor();
    const int64_t k = x.size(-1), m = x.numel() / k, mp = padded(m);
    const Fp8Tensor xq =
        quantize_role(pad_rows(x.reshape({m, k}), mp), Fp8Format::kE4m3, st.input, st.config, true, true);
    const QuantWeights wq = quantize_weights(weights, at::Tensor(), true, false);
    at::Tensor y = fp8_gemm(st, xq.data, wq.data.t(), xq.inv_scale, wq.inv_scale, x.scalar_type(), true, bias);
    if (mp != m) y = y.narrow(0, 0, m);
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = y.size(1);
    ctx->saved_data["state"] = state_ptr;
    ctx->saved_data["x_sizes"] = x.sizes().vec();
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["bias_dtype"] = static_cast<int64_t>(with_bias ? bias.scalar_type() : at::kFloat);
    ctx->saved_data["with_bias"] = with_bias;
    std::vector<at::Tensor> keep{xq.data_t, xq.inv_scale, wq.amax};  // x^T in FP8, not x
    keep.insert(keep.end(), weights.begin(), weights.end());
    ctx->save_for_backward(keep);
    if (!expose) return {y.reshape(shape)};
    ctx->mark_non_differentiable({xq.data_t, xq.inv_scale, wq.amax});
    return {y.reshape(shape), xq.data_t, xq.inv_scale, wq.amax};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    Float8State& st = state_of(ctx);
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &xq_t = saved[0], &x_inv = saved[1], &w_amax = saved[2];
    const at::TensorList weights = at::TensorList(saved).slice(3);
    const std::vector<int64_t> x_sizes = ctx->saved_data["x_sizes"].toIntVector();
    const auto x_dtype = static_cast<at::ScalarType>(ctx->saved_data["x_dtype"].toInt());
    const bool with_bias = ctx->saved_data["with_bias"].toBool();
    // x, weights, the bias, state_ptr, expose, with_bias
    variable_list result(1 + weights.size() + (with_bias ? 1 : 0) + 3);
    if (!grads[0].defined()) return result;
    const int64_t n = grads[0].size(-1), m = grads[0].numel() / n, mp = xq_t.size(1);
    const bool need_x = ctx->needs_input_grad(0);
    if (with_bias && st.pending_grad && !st.pending_grad->bias_grad.defined())
      throw std::logic_error("float8_linear: a GEMM with a bias took a gradient cast without its column sums");
    if (with_bias && ctx->needs_input_grad(1 + weights.size())) {
      const auto bias_dtype = static_cast<at::ScalarType>(ctx->saved_data["bias_dtype"].toInt());
      result[1 + weights.size()] =
          st.pending_grad ? st.pending_grad->bias_grad.to(bias_dtype) : kernels::bias_grad(grads[0], bias_dtype);
    }
    Fp8Tensor gq;
    if (st.pending_grad) {
      // The GeGLU (GELU) backward already cast this gradient (grads[0] is its zero-stride placeholder).
      gq.data = std::move(st.pending_grad->data);
      gq.data_t = std::move(st.pending_grad->data_t);
      gq.inv_scale = std::move(st.pending_grad->inv_scale);
      st.pending_grad.reset();
      ++st.pending_grads_taken;
      if (gq.data_t.size(0) != n || gq.data_t.size(1) != mp)
        throw std::logic_error("float8_linear: the FP8 gradient left by the GeGLU (GELU) backward has the wrong shape");
    } else {
      gq = quantize_role(pad_rows(grads[0].reshape({m, n}), mp), Fp8Format::kE5m2, st.grad_output, st.config, need_x,
                         true);
    }
    if (need_x) {
      const QuantWeights wt = quantize_weights(weights, w_amax, false, true);
      at::Tensor dx = fp8_gemm(st, gq.data, wt.data_t.t(), gq.inv_scale, wt.inv_scale, x_dtype, false);
      result[0] = (mp != m ? dx.narrow(0, 0, m) : dx).reshape(x_sizes);
    }
    int64_t offset = 0;
    for (size_t i = 0; i < weights.size(); ++i) {
      const int64_t rows = weights[i].size(0);
      if (ctx->needs_input_grad(1 + i)) {
        result[1 + i] = fp8_gemm(st, gq.data_t.narrow(0, offset, rows), xq_t.t(), gq.inv_scale, x_inv,
                                 grad_dtype(weights[i]), false)
                            .to(weights[i].scalar_type());
      }
      offset += rows;
    }
    return result;
  }
};

// down_proj's input geglu(merged) [m, F] as e4m3 with the role's scaling (row-major, padded to mp rows). With the
// fused casts the GeGLU kernel writes FP8 directly (no bf16 act in memory).
bool geglu_casts_fuse(const Float8State& st, const at::Tensor& merged2, int64_t mp) {
  return st.config.fused_geglu_casts && merged2.size(0) == mp && merged2.is_contiguous() &&
         (merged2.size(1) / 2) % 16 == 0;
}

// With `blocks` defined, merged2 also goes to its e4m3 blocks (in the same pass where the casts fuse).
Fp8Tensor quantize_geglu_output(const at::Tensor& merged2, int64_t mp, Float8State& st,
                                const kernels::GegluBlocks& blocks) {
  const int64_t m = merged2.size(0), f = merged2.size(1) / 2;
  if (geglu_casts_fuse(st, merged2, mp)) {
    return quantize_role_with(
        m, f, merged2.options(), Fp8Format::kE4m3, st.input, st.config, true, false,
        [&](const at::Tensor& amax) { kernels::fp8_geglu_amax_into(merged2, amax); },
        [&](const at::Tensor& amax_in, int64_t skip, const Fp8QuantOutputs& o) {
          kernels::fp8_geglu_quantize_into(merged2, amax_in, skip, o, blocks);
        });
  }
  if (blocks.defined()) kernels::geglu_blocks_quantize_ref(merged2, blocks);
  return quantize_role(pad_rows(kernels::geglu(merged2), mp), Fp8Format::kE4m3, st.input, st.config, true, false);
}

// A GEMM's input rebuilt for its weight gradient, act [mp, F] -> act^T [F, mp] in e4m3 with the forward's amax (so
// the bytes the forward GEMM read, transposed).
struct CastOutput {
  at::Tensor data_t, inv_scale;
};
CastOutput rebuilt_input_t(const at::Tensor& act, const at::Tensor& act_amax) {
  const int64_t mp = act.size(0);
  CastOutput c;
  c.data_t = at::empty({act.size(1), mp}, act.options().dtype(at::kFloat8_e4m3fn));
  c.inv_scale = at::empty({}, act.options().dtype(at::kFloat));
  Fp8QuantOutputs o;
  o.out_t = c.data_t;
  o.inv_scale = c.inv_scale;
  kernels::fp8_quantize_into(act, Fp8Format::kE4m3, act_amax, -1, o);
  return c;
}

// down_proj's rebuilt input: geglu(merged)^T [F, mp].
CastOutput geglu_output_t(const at::Tensor& merged2, int64_t mp, const at::Tensor& act_amax) {
  return rebuilt_input_t(pad_rows(kernels::geglu(merged2), mp), act_amax);
}

// The fused GeGLU backward: d merged cast to e5m2 (both layouts, the producer GEMM's grad_output scaling) and left
// in producer.pending_grad; returns down_proj's rebuilt input (as geglu_output_t) from the same pass.
// merged2 or, with it undefined, its e4m3 blocks.
CastOutput geglu_backward_cast(const at::Tensor& grad_act2, const at::Tensor& merged2,
                               const kernels::GegluBlocks& blocks, const at::Tensor& act_amax, Float8State& producer) {
  const int64_t m = grad_act2.size(0), f = grad_act2.size(1);
  CastOutput act;
  act.data_t = at::empty({f, m}, grad_act2.options().dtype(at::kFloat8_e4m3fn));
  act.inv_scale = at::empty({}, grad_act2.options().dtype(at::kFloat));
  const Fp8Tensor gq = quantize_role_with(
      m, 2 * f, grad_act2.options(), Fp8Format::kE5m2, producer.grad_output, producer.config, true, true,
      [&](const at::Tensor& amax) { kernels::fp8_geglu_backward_amax_into(grad_act2, merged2, amax, blocks); },
      [&](const at::Tensor& amax_in, int64_t skip, const Fp8QuantOutputs& o) {
        kernels::Fp8GegluGradOutputs g;
        g.grad_merged = o;
        g.act_t = act.data_t;
        g.act_inv_scale = act.inv_scale;
        kernels::fp8_geglu_backward_quantize_into(grad_act2, merged2, Fp8Format::kE5m2, amax_in, skip, act_amax, g,
                                                  blocks);
      });
  producer.pending_grad = Fp8Gradient{gq.data, gq.data_t, gq.inv_scale, at::Tensor()};
  return act;
}

// The fused GELU backward: d pre cast to e5m2 (both layouts, the producer GEMM's grad_output scaling) with its column
// sums, left in producer.pending_grad; returns fc2's rebuilt input (as rebuilt_input_t of gelu(pre)) from the same
// pass.
CastOutput gelu_backward_cast(const at::Tensor& grad_act2, const at::Tensor& pre2, const at::Tensor& act_amax,
                              Float8State& producer) {
  const int64_t m = pre2.size(0), f = pre2.size(1);
  CastOutput act;
  act.data_t = at::empty({f, m}, pre2.options().dtype(at::kFloat8_e4m3fn));
  act.inv_scale = at::empty({}, pre2.options().dtype(at::kFloat));
  const at::Tensor bias_grad = at::empty({f}, pre2.options());
  const Fp8Tensor gq = quantize_role_with(
      m, f, pre2.options(), Fp8Format::kE5m2, producer.grad_output, producer.config, true, true,
      [&](const at::Tensor& amax) { kernels::fp8_gelu_backward_amax_into(grad_act2, pre2, amax); },
      [&](const at::Tensor& amax_in, int64_t skip, const Fp8QuantOutputs& o) {
        kernels::Fp8GeluGradOutputs g;
        g.grad_pre = o;
        g.act_t = act.data_t;
        g.act_inv_scale = act.inv_scale;
        g.bias_grad = bias_grad;
        kernels::fp8_gelu_backward_quantize_into(grad_act2, pre2, Fp8Format::kE5m2, amax_in, skip, act_amax, g);
      });
  producer.pending_grad = Fp8Gradient{gq.data, gq.data_t, gq.inv_scale, bias_grad};
  return act;
}

// down(geglu(merged)) with the down GEMM in FP8; saves merged (as kernels::geglu_linear; with a rebuild, what
// rebuilds it instead; with config.saved_geglu_blocks, its e4m3 blocks) and the scale of the GeGLU output, which the
// backward recomputes and re-quantizes (transposed) with that same scale.
struct Float8GegluLinearFn : public torch::autograd::Function<Float8GegluLinearFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& merged, const at::Tensor& weight, int64_t state_ptr,
                            int64_t producer_ptr, const std::string& scope_fqn,
                            const c10::intrusive_ptr<kernels::RebuildHolder>& rebuild, at::TensorList rebuild_saved) {
    Float8State& st = *reinterpret_cast<Float8State*>(state_ptr);
    const int64_t f = merged.size(-1) / 2, m = merged.numel() / (2 * f), mp = padded(m);
    const at::Tensor merged2 = merged.reshape({m, 2 * f});
    kernels::GegluBlocks blocks;
    if (!rebuild && st.config.saved_geglu_blocks && kernels::geglu_blocks_supported(f) && m == mp &&
        merged2.is_contiguous())
      blocks = kernels::geglu_blocks_like(merged2);
    const Fp8Tensor aq = quantize_geglu_output(merged2, mp, st, blocks);
    at::Tensor y;
    {
      std::optional<profiler::Scope> scope;
      if (!scope_fqn.empty()) scope.emplace(scope_fqn);
      const QuantWeights wq = quantize_weights({weight}, at::Tensor(), true, false);
      y = fp8_gemm(st, aq.data, wq.data.t(), aq.inv_scale, wq.inv_scale, merged.scalar_type(), true);
      std::vector<at::Tensor> keep{rebuild || blocks.defined() ? at::Tensor() : merged,
                                   weight,
                                   wq.amax,
                                   aq.amax_used,
                                   blocks.data,
                                   blocks.inv_scale};
      keep.insert(keep.end(), rebuild_saved.begin(), rebuild_saved.end());
      ctx->save_for_backward(keep);
      kernels::remember_rebuild(ctx, rebuild);
    }
    if (mp != m) y = y.narrow(0, 0, m);
    std::vector<int64_t> shape = merged.sizes().vec();
    shape.back() = y.size(1);
    ctx->saved_data["state"] = state_ptr;
    ctx->saved_data["merged_sizes"] = merged.sizes().vec();
    remember_producer(ctx, producer_ptr);
    return y.reshape(shape);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    Float8State& st = state_of(ctx);
    Float8State* producer = producer_of(ctx);
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &weight = saved[1], &w_amax = saved[2], &act_amax = saved[3];
    const kernels::GegluBlocks blocks{saved[4], saved[5]};
    // Inputs: merged, weight, state_ptr, producer_ptr, scope_fqn, rebuild, rebuild_saved...
    variable_list result(6 + (saved.size() - 6));
    if (!grads[0].defined()) return result;
    const std::vector<int64_t> merged_sizes = ctx->saved_data["merged_sizes"].toIntVector();
    const int64_t n = weight.size(0), f = weight.size(1), m = grads[0].numel() / n, mp = padded(m);
    const Fp8Tensor gq =
        quantize_role(pad_rows(grads[0].reshape({m, n}), mp), Fp8Format::kE5m2, st.grad_output, st.config, true, true);
    // merged as kept (or rebuilt); with blocks kept instead, the fused pass reads them and the unfused path the
    // values read back.
    at::Tensor merged = blocks.defined() ? at::Tensor() : kernels::kept_or_rebuilt(ctx, saved, 6);
    at::Tensor merged2 = blocks.defined() ? at::Tensor() : merged.reshape({m, 2 * f});
    const bool fuse = producer != nullptr && (blocks.defined() ? producer->config.fused_geglu_casts
                                                               : geglu_casts_fuse(*producer, merged2, mp));
    if (fuse) {
      // One pass from merged and d act: d merged in e5m2 for the gate+up GEMM (left in its pending_grad, both
      // layouts) and this GEMM's rebuilt input, transposed; no bf16 d merged or act in memory.
      const QuantWeights wt = quantize_weights({weight}, w_amax, false, true);
      const at::Tensor grad_act =
          fp8_gemm(st, gq.data, wt.data_t.t(), gq.inv_scale, wt.inv_scale, grads[0].scalar_type(), false);
      const CastOutput act = geglu_backward_cast(grad_act, merged2, blocks, act_amax, *producer);
      if (ctx->needs_input_grad(1))  // a frozen down_proj gets no weight gradient
        result[1] = fp8_gemm(st, gq.data_t, act.data_t.t(), gq.inv_scale, act.inv_scale, grad_dtype(weight), false)
                        .to(weight.scalar_type());
      // The gate+up GEMM's backward reads pending_grad; autograd still needs a gradient of merged's shape.
      result[0] = at::zeros({}, grads[0].options()).expand(merged_sizes);
      return result;
    }
    if (blocks.defined()) {
      merged = kernels::geglu_blocks_dequantize(blocks, grads[0].scalar_type()).reshape(merged_sizes);
      merged2 = merged.reshape({m, 2 * f});
    }
    if (ctx->needs_input_grad(1)) {
      // The GeGLU output recomputed, cast transposed with the forward's scale; freed after the weight gradient.
      const CastOutput act = geglu_output_t(merged2, mp, act_amax);
      result[1] = fp8_gemm(st, gq.data_t, act.data_t.t(), gq.inv_scale, act.inv_scale, grad_dtype(weight), false)
                      .to(weight.scalar_type());
    }
    const QuantWeights wt = quantize_weights({weight}, w_amax, false, true);
    at::Tensor grad_act = fp8_gemm(st, gq.data, wt.data_t.t(), gq.inv_scale, wt.inv_scale, merged.scalar_type(), false);
    if (mp != m) grad_act = grad_act.narrow(0, 0, m);
    std::vector<int64_t> act_shape = merged.sizes().vec();
    act_shape.back() = f;
    result[0] = kernels::geglu_backward(grad_act.reshape(act_shape), merged);
    return result;
  }
};

// fc2(gelu(pre)) with fc2 in FP8 (kernels::gelu_linear's FP8 form): the GELU output cast to e4m3 (row-major) for
// the GEMM by the cast kernel that computes it (kernels::fp8_gelu_quantize_into: no GELU output in memory; the GELU
// kernel then the cast where the rows need padding), the bias in the GEMM's epilogue. Saves pre only, as the bf16
// node does: the backward kernel rebuilds gelu(pre) over the consumed input gradient, and that is cast transposed
// with the forward's amax for the weight gradient (the forward's bytes again).
struct Float8GeluLinearFn : public torch::autograd::Function<Float8GeluLinearFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& pre, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias_in, int64_t state_ptr, int64_t producer_ptr,
                            const std::string& scope_fqn) {
    Float8State& st = *reinterpret_cast<Float8State*>(state_ptr);
    const at::Tensor bias = bias_in.value_or(at::Tensor());
    const int64_t f = pre.size(-1), m = pre.numel() / f, mp = padded(m);
    const at::Tensor pre2 = pre.reshape({m, f});
    at::Tensor y;
    {
      std::optional<profiler::Scope> scope;
      if (!scope_fqn.empty()) scope.emplace(scope_fqn);
      const Fp8Tensor aq =
          mp == m && pre2.is_contiguous()
              ? quantize_role_with(
                    m, f, pre.options(), Fp8Format::kE4m3, st.input, st.config, true, false,
                    [&](const at::Tensor& amax) { kernels::fp8_gelu_amax_into(pre2, amax); },
                    [&](const at::Tensor& amax_in, int64_t skip, const Fp8QuantOutputs& o) {
                      kernels::fp8_gelu_quantize_into(pre2, amax_in, skip, o);
                    })
              : quantize_role(pad_rows(kernels::gelu(pre2), mp), Fp8Format::kE4m3, st.input, st.config, true, false);
      const QuantWeights wq = quantize_weights({weight}, at::Tensor(), true, false);
      y = fp8_gemm(st, aq.data, wq.data.t(), aq.inv_scale, wq.inv_scale, pre.scalar_type(), true, bias);
      ctx->save_for_backward({pre, weight, bias, wq.amax, aq.amax_used});
    }
    if (mp != m) y = y.narrow(0, 0, m);
    std::vector<int64_t> shape = pre.sizes().vec();
    shape.back() = y.size(1);
    ctx->saved_data["state"] = state_ptr;
    remember_producer(ctx, producer_ptr);
    return y.reshape(shape);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    Float8State& st = state_of(ctx);
    Float8State* producer = producer_of(ctx);
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &pre = saved[0], &weight = saved[1], &bias = saved[2], &w_amax = saved[3], &act_amax = saved[4];
    variable_list result(6);  // pre, weight, bias, state_ptr, producer_ptr, scope_fqn
    if (!grads[0].defined()) return result;
    const int64_t n = weight.size(0), f = weight.size(1), m = grads[0].numel() / n, mp = padded(m);
    // A frozen weight (or bias) gets no gradient, and then the GELU output is not rebuilt for it.
    const bool want_pre = ctx->needs_input_grad(0), want_w = ctx->needs_input_grad(1);
    if (bias.defined() && ctx->needs_input_grad(2)) result[2] = kernels::bias_grad(grads[0], bias.scalar_type());
    if (!want_pre && !want_w) return result;
    const Fp8Tensor gq = quantize_role(pad_rows(grads[0].reshape({m, n}), mp), Fp8Format::kE5m2, st.grad_output,
                                       st.config, want_pre, want_w);
    if (producer != nullptr && producer->config.fused_gelu_casts && want_pre && want_w && mp == m &&
        pre.is_contiguous()) {
      // One pass from pre and d act: d pre in e5m2 with its column sums for fc1 (left in its pending_grad) and this
      // GEMM's rebuilt input, transposed; no bf16 d pre or act in memory.
      const QuantWeights wt = quantize_weights({weight}, w_amax, false, true);
      const at::Tensor grad_act =
          fp8_gemm(st, gq.data, wt.data_t.t(), gq.inv_scale, wt.inv_scale, pre.scalar_type(), false);
      const CastOutput act = gelu_backward_cast(grad_act, pre.reshape({m, f}), act_amax, *producer);
      result[1] = fp8_gemm(st, gq.data_t, act.data_t.t(), gq.inv_scale, act.inv_scale, grad_dtype(weight), false)
                      .to(weight.scalar_type());
      // fc1's backward reads pending_grad; autograd still needs a gradient of pre's shape.
      result[0] = at::zeros({}, grads[0].options()).expand(pre.sizes());
      return result;
    }
    at::Tensor act;
    if (want_pre) {
      const QuantWeights wt = quantize_weights({weight}, w_amax, false, true);
      at::Tensor grad_act = fp8_gemm(st, gq.data, wt.data_t.t(), gq.inv_scale, wt.inv_scale, pre.scalar_type(), false);
      if (mp != m) grad_act = grad_act.narrow(0, 0, m);
      grad_act = grad_act.view(pre.sizes());
      if (want_w) {
        kernels::GeluGrads r = kernels::gelu_backward_rebuild(grad_act, pre);
        result[0] = std::move(r.grad_x);
        act = std::move(r.act);
      } else {
        result[0] = kernels::gelu_backward(grad_act, pre);
      }
    }
    if (want_w) {
      if (!act.defined()) act = kernels::gelu(pre);
      const CastOutput a = rebuilt_input_t(pad_rows(act.reshape({m, f}), mp), act_amax);
      result[1] = fp8_gemm(st, gq.data_t, a.data_t.t(), gq.inv_scale, a.inv_scale, grad_dtype(weight), false)
                      .to(weight.scalar_type());
    }
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
                            const torch::Tensor& bias, Float8State& state, kernels::MergedRebuild* rebuild) {
  if (weights.empty()) throw std::invalid_argument("float8_linear: no weights");
  if (!x.defined() || x.dim() < 1 || !at::isFloatingType(x.scalar_type()))
    throw std::invalid_argument("float8_linear: x must be a floating tensor");
  for (const at::Tensor& w : weights) check_weight(w, x.size(-1));
  if (bias.defined()) {
    int64_t outputs = 0;
    for (const at::Tensor& w : weights) outputs += w.size(0);
    if (bias.dim() != 1 || bias.size(0) != outputs)
      throw std::invalid_argument("float8_linear: bias of shape " + c10::str(bias.sizes()) + " for " +
                                  std::to_string(outputs) + " outputs (the members' biases, concatenated)");
  }
  if (bias.defined() && rebuild != nullptr) throw std::invalid_argument("float8_linear: no rebuild with a bias");
  std::vector<at::Tensor> args{x};
  args.insert(args.end(), weights.begin(), weights.end());
  if (bias.defined()) args.push_back(bias);
  const auto out = Float8LinearFn::apply(at::TensorList(args), reinterpret_cast<int64_t>(&state), rebuild != nullptr,
                                         bias.defined());
  const at::Tensor& y = out[0];
  if (rebuild != nullptr) {
    // Rebuilt from the node's own x_q^T (transposed back: the forward's row-major copy, byte for byte) and the
    // weights re-quantized with the saved amax (the forward's scale): the forward GEMM again, bit-identical, and
    // no byte more held than the node keeps anyway.
    rebuild->saved = {out[1], out[2], out[3]};
    for (const at::Tensor& w : weights) rebuild->saved.push_back(w.detach());
    const int64_t m = x.numel() / x.size(-1);
    const std::vector<int64_t> shape = y.sizes().vec();
    const at::ScalarType dtype = x.scalar_type();
    // The forward's GEMM problem, so a timed algorithm choice is the forward's too.
    const kernels::Fp8GemmAlgorithm algorithm = state.config.gemm_algorithm;
    rebuild->fn = [m, shape, dtype, algorithm](const std::vector<at::Tensor>& s) {
      at::NoGradGuard no_grad;
      const at::Tensor xq = s[0].t().contiguous();
      const QuantWeights wq = quantize_weights(at::TensorList(s).slice(3), s[2], true, false);
      at::Tensor merged = kernels::fp8_mm(xq, wq.data.t(), s[1], wq.inv_scale, dtype, true, {}, algorithm);
      if (merged.size(0) != m) merged = merged.narrow(0, 0, m);
      return merged.reshape(shape);
    };
  }
  return y;
}

torch::Tensor float8_geglu_linear(const torch::Tensor& merged, const torch::Tensor& weight, Float8State& state,
                                  const std::string& scope_fqn, const kernels::MergedRebuild* rebuild,
                                  Float8State* producer) {
  if (!merged.defined() || merged.size(-1) % 2 != 0)
    throw std::invalid_argument("float8_geglu_linear: merged must be [..., 2F]");
  check_weight(weight, merged.size(-1) / 2);
  const auto state_ptr = reinterpret_cast<int64_t>(&state);
  const auto producer_ptr = reinterpret_cast<int64_t>(producer);
  return Float8GegluLinearFn::apply(merged, weight, state_ptr, producer_ptr, scope_fqn,
                                    kernels::rebuild_holder(rebuild, "float8_geglu_linear"),
                                    rebuild ? at::TensorList(rebuild->saved) : at::TensorList());
}

torch::Tensor float8_gelu_linear(const torch::Tensor& pre, const torch::Tensor& weight, const torch::Tensor& bias,
                                 Float8State& state, const std::string& scope_fqn, Float8State* producer) {
  if (!pre.defined() || pre.dim() < 1 || !at::isFloatingType(pre.scalar_type()))
    throw std::invalid_argument("float8_gelu_linear: pre must be a floating tensor [..., F]");
  check_weight(weight, pre.size(-1));
  if (bias.defined() && (bias.dim() != 1 || bias.size(0) != weight.size(0)))
    throw std::invalid_argument("float8_gelu_linear: bias of shape " + c10::str(bias.sizes()) + " for " +
                                std::to_string(weight.size(0)) + " outputs");
  return Float8GeluLinearFn::apply(pre, weight, bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt,
                                   reinterpret_cast<int64_t>(&state), reinterpret_cast<int64_t>(producer), scope_fqn);
}

}  // namespace vlatune::model
