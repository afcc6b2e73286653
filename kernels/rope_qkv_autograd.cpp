// RoPE + QKV split's torch entry point (contract: fused_ops.h): input checks, dispatch by device (rope_qkv.cu's
// kernels on CUDA, else the reference forward with its analytic backward), the autograd node.
#include <torch/torch.h>

#include <cstdint>
#include <utility>

#include "kernels/fused_ops.h"
#include "kernels/op_support.h"
#include "kernels/rope_qkv.h"

namespace vlatune::kernels {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

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

// Analytic backward of the reference: the transpose of the rotation (a rotation by -angle), then the inverse of the
// split/concat.
std::pair<at::Tensor, at::Tensor> rope_qkv_bwd_ref(const RopeShape& r, const at::Tensor& gq, const at::Tensor& gk,
                                                   const at::Tensor& gv, const at::Tensor& cos, const at::Tensor& sin,
                                                   at::ScalarType dtype) {
  const at::Tensor minus_sin = sin.neg();
  auto q = r.prefix_q ? apply_rope_ref(gq, cos, minus_sin)
                      : apply_rope_ref(gq, cos.narrow(2, r.p, r.s), minus_sin.narrow(2, r.p, r.s));
  auto k = apply_rope_ref(gk, cos, minus_sin);
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

}  // namespace

QkvHeads rope_qkv(const at::Tensor& qkv_prefix, const at::Tensor& qkv_suffix, const at::Tensor& cos,
                  const at::Tensor& sin, int64_t heads, int64_t kv_heads, bool prefix_q) {
  const RopeShape r = rope_shape(qkv_prefix, qkv_suffix, heads, kv_heads, prefix_q);
  if (!cos.defined() || cos.dim() != 4 || cos.size(0) != r.batch || cos.size(2) != r.p + r.s ||
      cos.size(3) != r.d / 2 || !sin.defined() || sin.sizes() != cos.sizes())
    fail("rope_qkv", "cos and sin must be [B, 1, P + S, head_dim / 2]", cos);
  auto out = RopeQkvFn::apply(qkv_prefix, qkv_suffix, cos, sin, heads, kv_heads, prefix_q);
  return {out[0], out[1], out[2]};
}

}  // namespace vlatune::kernels
