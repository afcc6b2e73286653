// The ATen references of the fused decoder kernels (contract: fused_ops.h): the exact op sequences the model ran
// before fusion (model/layers.cpp RMSNorm / AdaRMSNorm, model/gemma.cpp apply_rope and the GeGLU MLP), so that on
// the CPU the model's math is unchanged. Differentiable by autograd; any device, any floating dtype.
#include <ATen/ATen.h>

#include "kernels/fused_ops.h"

namespace vlatune::kernels {

namespace {

at::ScalarType math_of(const at::Tensor& t) {
  return t.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

at::Tensor like(const at::Tensor& t, const at::Tensor& ref) {
  return t.scalar_type() == ref.scalar_type() ? t : t.to(ref.scalar_type());
}

// model::apply_rope: half-split rotation of x [B, H, T, D] by tables [B, 1, T, D/2], in the tables' dtype.
at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  auto xf = x.to(cos.scalar_type());
  auto u = xf.narrow(-1, 0, half), v = xf.narrow(-1, half, half);
  return at::cat({u * cos - v * sin, v * cos + u * sin}, -1).to(x.scalar_type());
}

}  // namespace

NormOutputs rms_norm_residual_ref(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight, double eps) {
  at::Tensor h = delta.defined() ? x + delta : x;
  const auto md = math_of(h);
  auto hf = h.to(md);
  auto y = hf * at::rsqrt(hf.pow(2).mean(-1, /*keepdim=*/true) + eps) * (weight.to(md) + 1.0);
  return {h, y.to(h.scalar_type())};
}

NormOutputs adarms_norm_residual_ref(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& gate,
                                     const at::Tensor& scale, const at::Tensor& shift, double eps) {
  at::Tensor h = delta.defined() ? x + like(gate, x) * delta : x;
  const auto md = math_of(h);
  auto hf = h.to(md);
  auto normed = hf * at::rsqrt(hf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  auto y = normed * (scale.to(md) + 1.0) + shift.to(md);
  return {h, y.to(h.scalar_type())};
}

QkvHeads rope_qkv_ref(const at::Tensor& qkv_prefix, const at::Tensor& qkv_suffix, const at::Tensor& cos,
                      const at::Tensor& sin, int64_t heads, int64_t kv_heads, bool prefix_q) {
  const int64_t batch = qkv_suffix.size(0), p = qkv_prefix.size(1), s = qkv_suffix.size(1);
  const int64_t d = qkv_suffix.size(2) / (heads + 2 * kv_heads);
  // [B, T, (h...)*D] -> the [B, h, T, D] view of heads [first, first + count).
  auto part = [&](const at::Tensor& y, int64_t t, int64_t first, int64_t count) {
    return y.narrow(-1, first * d, count * d).view({batch, t, count, d}).transpose(1, 2);
  };
  const int64_t pq = prefix_q ? heads : 0;
  auto k = apply_rope(at::cat({part(qkv_prefix, p, pq, kv_heads), part(qkv_suffix, s, heads, kv_heads)}, 2), cos, sin);
  auto v = at::cat({part(qkv_prefix, p, pq + kv_heads, kv_heads), part(qkv_suffix, s, heads + kv_heads, kv_heads)}, 2);
  at::Tensor q;
  if (prefix_q) {
    q = apply_rope(at::cat({part(qkv_prefix, p, 0, heads), part(qkv_suffix, s, 0, heads)}, 2), cos, sin);
  } else {
    q = apply_rope(part(qkv_suffix, s, 0, heads), cos.narrow(2, p, s), sin.narrow(2, p, s));
  }
  return {q, k, v};
}

NormOutputs layer_norm_residual_ref(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight,
                                    const at::Tensor& bias, double eps) {
  at::Tensor h = delta.defined() ? x + delta : x;
  return {h, at::layer_norm(h, {h.size(-1)}, like(weight, h), like(bias, h), eps)};
}

at::Tensor gelu_ref(const at::Tensor& x) {
  return at::gelu(x, "tanh");
}

at::Tensor geglu_ref(const at::Tensor& merged) {
  const int64_t f = merged.size(-1) / 2;
  return at::gelu(merged.narrow(-1, 0, f), "tanh") * merged.narrow(-1, f, f);
}

}  // namespace vlatune::kernels
