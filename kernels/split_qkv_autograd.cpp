// split_qkv_heads's torch entry point (contract: fused_ops.h): SigLIP's merged QKV output as three head views, and
// a backward that writes their gradients into one tensor. A view op: no kernel, no reference of its own.
#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "kernels/fused_ops.h"
#include "kernels/op_support.h"

namespace vlatune::kernels {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

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

QkvHeads split_qkv_heads(const at::Tensor& qkv, int64_t heads) {
  if (!qkv.defined() || qkv.dim() != 3 || heads <= 0 || qkv.size(2) % (3 * heads) != 0)
    fail("split_qkv_heads", "qkv must be [B, T, 3 * heads * head_dim] with heads = " + std::to_string(heads), qkv);
  auto out = SplitQkvFn::apply(qkv.is_contiguous() ? qkv : qkv.contiguous(), heads);
  return {out[0], out[1], out[2]};
}

}  // namespace vlatune::kernels
