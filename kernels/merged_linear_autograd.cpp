// merged_linear's torch entry point (contract: fused_ops.h): one GEMM for the Linears that read the same input, its
// autograd node, the packed-rows view of their weights, and the rebuild of its output for the gate+up recompute
// unit (merged_rebuild_node.h). ATen's GEMMs; no kernel of its own.
#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "kernels/fused_ops.h"
#include "kernels/merged_rebuild_node.h"
#include "kernels/op_support.h"

namespace vlatune::kernels {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

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
    return at::linear(x, weight, bias);
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
    if (ctx->needs_input_grad(0)) result[0] = at::mm(g, stacked(weights, g)).view(x.sizes());  // stack rebuilt
    const at::Tensor x2 = x.reshape({-1, k});
    // The bias gradients from one reduction over the contiguous rows (three strided column reductions read the
    // gradient at a third of the bandwidth).
    const at::Tensor bias_sums = has_bias ? bias_grad(g, g.scalar_type()) : at::Tensor();
    // Every member's weight gradient from one GEMM over the whole gradient (each member's rows of g^T x are its dW:
    // disjoint views, as a cat's backward gives): the counterpart of the forward's one GEMM, where a GEMM per
    // member reads its strided columns of g. A GEMM per member when a member needs no gradient.
    at::Tensor dw_all;
    bool all_w = true;
    for (int64_t i = 0; i < count; ++i) all_w = all_w && ctx->needs_input_grad(1 + i);
    if (all_w && count > 1) dw_all = at::mm(g.t(), x2);  // [sum n, k]
    int64_t offset = 0;
    for (int64_t i = 0; i < count; ++i) {
      const int64_t n = weights[i].size(0);
      const at::ScalarType dtype = weights[i].scalar_type();
      const bool want_w = ctx->needs_input_grad(1 + i), want_b = has_bias && ctx->needs_input_grad(1 + count + i);
      // Disjoint views of one sum (as the members' weight gradients of a cat's backward would be).
      if (want_b) result[1 + count + i] = bias_sums.narrow(0, offset, n).to(dtype);
      if (dw_all.defined()) {
        result[1 + i] = dw_all.narrow(0, offset, n).to(dtype);
      } else if (want_w) {
        result[1 + i] = at::mm(g.narrow(1, offset, n).t(), x2).to(dtype);  // strided columns: read in place
      }
      offset += n;
    }
    return result;
  }
};

}  // namespace

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

}  // namespace vlatune::kernels
