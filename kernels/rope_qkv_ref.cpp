// RoPE + QKV split's ATen reference (contract: fused_ops.h): the model's reference path rotates with
// apply_rope_ref, the autograd node's CPU path runs both, the tests compare with them. Differentiable by autograd.
#include <ATen/ATen.h>

#include "kernels/fused_ops.h"

namespace vlatune::kernels {

at::Tensor apply_rope_ref(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  auto xf = x.to(cos.scalar_type());
  auto u = xf.narrow(-1, 0, half), v = xf.narrow(-1, half, half);
  return at::cat({u * cos - v * sin, v * cos + u * sin}, -1).to(x.scalar_type());
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
  auto k =
      apply_rope_ref(at::cat({part(qkv_prefix, p, pq, kv_heads), part(qkv_suffix, s, heads, kv_heads)}, 2), cos, sin);
  auto v = at::cat({part(qkv_prefix, p, pq + kv_heads, kv_heads), part(qkv_suffix, s, heads + kv_heads, kv_heads)}, 2);
  at::Tensor q;
  if (prefix_q) {
    q = apply_rope_ref(at::cat({part(qkv_prefix, p, 0, heads), part(qkv_suffix, s, 0, heads)}, 2), cos, sin);
  } else {
    q = apply_rope_ref(part(qkv_suffix, s, 0, heads), cos.narrow(2, p, s), sin.narrow(2, p, s));
  }
  return {q, k, v};
}

}  // namespace vlatune::kernels
