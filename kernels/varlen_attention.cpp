// Varlen joint attention (varlen_attention.h): the layout built on the device, the autograd node around ATen's
// FlashAttention-2 varlen kernels.
#include "kernels/varlen_attention.h"

#include <torch/torch.h>

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#ifdef VLATUNE_HAVE_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

namespace vlatune::kernels {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

[[noreturn]] void fail(const std::string& what) {
  throw std::invalid_argument("varlen_attention: " + what);
}

// A key row's gradient from the packed slots' (slot `slots` zeroed first: rows with no slot, or no second slot).
at::Tensor gather_grad(at::Tensor packed, const at::Tensor& first_slot, const at::Tensor& second_slot, int64_t slots) {
  packed.narrow(0, slots, 1).zero_();
  at::Tensor grad = packed.index_select(0, first_slot);
  // Two addends: ATen adds in fp32 and rounds once, as one fp32 sum would.
  return second_slot.numel() > 0 ? at::add(grad, packed.index_select(0, second_slot)) : grad;
}

// args: q, k, v, gather, first_slot, second_slot (empty: none), cu_q, cu_k (only q, k, v differentiable).
struct VarlenAttentionFn : public torch::autograd::Function<VarlenAttentionFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& gather, const at::Tensor& first_slot, const at::Tensor& second_slot,
                            const at::Tensor& cu_q, const at::Tensor& cu_k, int64_t slots, int64_t max_q, int64_t max_k,
                            double scale) {
    const at::Tensor kp = k.index_select(0, gather), vp = v.index_select(0, gather);
    [[maybe_unused]] auto [out, lse, rng_state, unused, debug_mask] =
        at::_flash_attention_forward(q, kp, vp, cu_q, cu_k, max_q, max_k, /*dropout_p=*/0.0, /*is_causal=*/false,
                                     /*return_debug_mask=*/false, scale);
    // The packed K/V are gathered again in backward (cheap) rather than kept: the saved tensors are the layer's
    // own q, k, v, as with SDPA.
    ctx->save_for_backward({q, k, v, out, lse, rng_state, unused, gather, first_slot, second_slot, cu_q, cu_k});
    ctx->saved_data["slots"] = slots;
    ctx->saved_data["max_q"] = max_q;
    ctx->saved_data["max_k"] = max_k;
    ctx->saved_data["scale"] = scale;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->get_saved_variables();
    const at::Tensor &q = s[0], &k = s[1], &v = s[2], &out = s[3], &lse = s[4], &rng_state = s[5], &unused = s[6];
    const at::Tensor &gather = s[7], &first_slot = s[8], &second_slot = s[9], &cu_q = s[10], &cu_k = s[11];
    const int64_t slots = ctx->saved_data["slots"].toInt();
    const at::Tensor kp = k.index_select(0, gather), vp = v.index_select(0, gather);
    auto [dq, dkp, dvp] = at::_flash_attention_backward(
        grads[0].contiguous(), q, kp, vp, out, lse, cu_q, cu_k, ctx->saved_data["max_q"].toInt(),
        ctx->saved_data["max_k"].toInt(), /*dropout_p=*/0.0, /*is_causal=*/false, rng_state, unused,
        ctx->saved_data["scale"].toDouble());
    variable_list result(12);
    result[0] = dq;
    result[1] = gather_grad(dkp, first_slot, second_slot, slots);
    result[2] = gather_grad(dvp, first_slot, second_slot, slots);
    return result;
  }
};

}  // namespace

VarlenLayout joint_varlen_layout(const at::Tensor& valid, int64_t prefix_len, bool prefix_queries) {
  if (!valid.defined() || valid.dim() != 2 || valid.scalar_type() != at::kBool)
    fail("valid must be a [B, N] bool tensor");
  const int64_t b = valid.size(0), n = valid.size(1), p = prefix_len, s = n - prefix_len;
  if (p < 0 || s < 0) fail("prefix_len " + std::to_string(p) + " outside [0, " + std::to_string(n) + "]");
  const auto longs = valid.options().dtype(at::kLong);
  const at::Tensor vp = valid.narrow(1, 0, p);
  const at::Tensor lp = vp.sum(1);                                         // valid prefix keys per sample
  const at::Tensor rank = vp.to(at::kLong).cumsum(1) - 1;                  // a valid key's place among them
  const at::Tensor first_row = at::arange(b, longs).mul_(n).unsqueeze(1);  // [B, 1]: sample b's row 0

  VarlenLayout layout;
  layout.rows_k = b * n;
  at::Tensor key_counts;  // per sequence, in order
  int64_t capacity = 0;
  if (prefix_queries) {
    key_counts = at::stack({lp, lp + s}, 1).reshape({2 * b});
    capacity = 2 * b * p + b * s;
    layout.cu_q = at::cat({(first_row + at::tensor({int64_t{0}, p}, longs).unsqueeze(0)).reshape({2 * b}),
                           at::full({1}, b * n, longs)})
                      .to(at::kInt);
    layout.rows_q = b * n;
    layout.max_q = std::max(p, s);
  } else {
    key_counts = lp + s;
    capacity = b * n;
    layout.cu_q = (at::arange(b + 1, longs) * s).to(at::kInt);
    layout.rows_q = b * s;
    layout.max_q = s;
  }
  layout.max_k = p + s;
  const at::Tensor cu_k = at::cat({at::zeros({1}, longs), key_counts.cumsum(0)});
  layout.cu_k = cu_k.to(at::kInt);
  const at::Tensor starts = cu_k.narrow(0, 0, key_counts.size(0));
  const at::Tensor suffix_starts = prefix_queries ? starts.slice(0, 1, 2 * b, 2) : starts;  // [B]

  // Per key row ([B, N] flattened: row b N + j), its slot(s); `capacity` (the zeroed extra slot) for none.
  const at::Tensor suffix_slots = suffix_starts.unsqueeze(1) + lp.unsqueeze(1) + at::arange(s, longs).unsqueeze(0);
  const at::Tensor in_suffix_seq = at::where(vp, suffix_starts.unsqueeze(1) + rank, capacity);  // [B, P]
  if (prefix_queries) {
    const at::Tensor in_prefix_seq = at::where(vp, starts.slice(0, 0, 2 * b, 2).unsqueeze(1) + rank, capacity);
    layout.first_slot = at::cat({in_prefix_seq, suffix_slots}, 1).reshape({-1});
    layout.second_slot = at::cat({in_suffix_seq, at::full({b, s}, capacity, longs)}, 1).reshape({-1});
  } else {
    layout.first_slot = at::cat({in_suffix_seq, suffix_slots}, 1).reshape({-1});
  }
  // Slot -> key row (rows without a slot all write the extra slot, which no sequence reads).
  layout.slots = capacity;
  layout.gather = at::zeros({capacity + 1}, longs);
  const at::Tensor all_rows = at::arange(layout.rows_k, longs);
  layout.gather.index_put_({layout.first_slot}, all_rows);
  if (layout.second_slot.defined()) layout.gather.index_put_({layout.second_slot}, all_rows);
  return layout;
}

bool varlen_attention_supported(const at::Tensor& x, int64_t head_dim) {
#ifdef VLATUNE_HAVE_CUDA
  if (const char* env = std::getenv("VLATUNE_VARLEN_ATTENTION"); env != nullptr && std::strcmp(env, "0") == 0)
    return false;
  if (!x.defined() || !x.is_cuda() || (x.scalar_type() != at::kBFloat16 && x.scalar_type() != at::kHalf)) return false;
  if (head_dim <= 0 || head_dim % 8 != 0 || head_dim > 256) return false;
  return at::cuda::getDeviceProperties(x.device().index())->major >= 8;
#else
  (void)x;
  (void)head_dim;
  return false;
#endif
}

at::Tensor varlen_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const VarlenLayout& layout,
                            double scale) {
  if (q.dim() != 3 || k.dim() != 3 || v.sizes() != k.sizes() || q.size(2) != k.size(2) || k.size(1) == 0 ||
      q.size(1) % k.size(1) != 0)
    fail("q must be [rows, H, D] and k, v [rows, Hk, D] with H a multiple of Hk");
  if (q.size(0) != layout.rows_q || k.size(0) != layout.rows_k)
    fail("rows " + std::to_string(q.size(0)) + " / " + std::to_string(k.size(0)) + " do not match the layout's " +
         std::to_string(layout.rows_q) + " / " + std::to_string(layout.rows_k));
  if (!q.is_contiguous() || !k.is_contiguous() || !v.is_contiguous()) fail("q, k and v must be contiguous");
  // autograd's input bookkeeping needs defined tensors: no second slot is an empty one.
  const at::Tensor second_slot = layout.second_slot.defined() ? layout.second_slot : layout.first_slot.new_empty({0});
  return VarlenAttentionFn::apply(q, k, v, layout.gather, layout.first_slot, second_slot, layout.cu_q, layout.cu_k,
                                  layout.slots, layout.max_q, layout.max_k, scale);
}

}  // namespace vlatune::kernels
