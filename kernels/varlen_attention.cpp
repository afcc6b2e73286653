// Varlen joint attention (varlen_attention.h): the layouts built on the device, the autograd nodes around ATen's
// FlashAttention-2 varlen kernels and around cuDNN's padding-mask kernels (cudnn_sdpa.h), the backend choice.
#include "kernels/varlen_attention.h"

#include <torch/torch.h>

#include <iostream>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#ifdef VLATUNE_HAVE_CUDA
#include <ATen/cuda/CUDAContext.h>

#include "kernels/cudnn_sdpa.h"
#include "kernels/cudnn_sdpa_tensors.h"
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

#ifdef VLATUNE_HAVE_CUDA
// The two padding-mask problems of one joint attention call (varlen_attention.h, cuDNN): the suffix queries over
// buffer rows [0, S + valid), the prefix queries (prefix_queries) over rows [S, S + valid). Queries and their
// gradients token-major [B, Tq, H, D]; outputs and their gradients one contiguous [B, T, H, D] per branch (the
// o_proj inputs, no copy); the key buffer [B, N, Hk, D]; the prefix call's dK/dV a separate [B, P, Hk, D], added
// into the buffer's gradient.
struct JointProblems {
  SdpaProblem prefix, suffix;
  int64_t suffix_q_offset = 0;  // elements from a query buffer's start to sample 0's first suffix query
  int64_t prefix_k_offset = 0;  // elements from the key buffer's start to sample 0's first prefix key
};

JointProblems joint_problems(const JointAttentionShape& shape, bool prefix_queries) {
  const int64_t b = shape.batch, p = shape.prefix_len, s = shape.suffix_len, n = p + s;
  const int64_t h = shape.heads, hk = shape.kv_heads, d = shape.head_dim, tq = prefix_queries ? n : s;
  SdpaProblem base;
  base.batch = b;
  base.heads = h;
  base.kv_heads = hk;
  base.head_dim = d;
  base.scale = static_cast<float>(shape.scale);
  base.q_stride = base.dq_stride = {tq * h * d, d, h * d, 1};
  base.k_stride = base.v_stride = base.dk_stride = base.dv_stride = {n * hk * d, d, hk * d, 1};
  JointProblems out;
  out.suffix = base;
  out.suffix.seq_q = s;
  out.suffix.seq_kv = n;
  out.suffix.o_stride = {s * h * d, d, h * d, 1};
  out.prefix = base;
  out.prefix.seq_q = p;
  out.prefix.seq_kv = p;
  out.prefix.o_stride = {p * h * d, d, h * d, 1};
  out.prefix.dk_stride = out.prefix.dv_stride = {p * hk * d, d, hk * d, 1};
  out.suffix_q_offset = prefix_queries ? p * h * d : 0;
  out.prefix_k_offset = s * hk * d;
  return out;
}

// args: q, k, v, kv_order, kv_grad_slot, the four int32 length tensors (only q, k, v differentiable). Outputs:
// {prefix [B * P, H, D], suffix [B * S, H, D]}, or {suffix} without prefix queries.
struct CudnnJointAttentionFn : public torch::autograd::Function<CudnnJointAttentionFn> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const at::Tensor& kv_order, const at::Tensor& kv_grad_slot,
                               const at::Tensor& prefix_seq_q, const at::Tensor& prefix_seq_kv,
                               const at::Tensor& suffix_seq_q, const at::Tensor& suffix_seq_kv, int64_t batch,
                               int64_t prefix_len, int64_t suffix_len, double scale) {
    const int64_t h = q.size(1), d = q.size(2);
    const JointAttentionShape shape{batch, prefix_len, suffix_len, h, k.size(1), d, scale};
    const bool prefix_queries = q.size(0) == batch * (prefix_len + suffix_len);
    const JointProblems problems = joint_problems(shape, prefix_queries);
    const at::Tensor kb = k.index_select(0, kv_order), vb = v.index_select(0, kv_order);
    const auto f32 = q.options().dtype(at::kFloat);
    at::Tensor out_suffix = at::empty({batch * suffix_len, h, d}, q.options());
    at::Tensor stats_suffix = at::empty({batch, h, suffix_len}, f32);
    at::Tensor out_prefix, stats_prefix;
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    SdpaWorkspaces workspaces(q.options());
    SdpaForwardArgs a;
    a.q = element_ptr(q, problems.suffix_q_offset);
    a.k = kb.data_ptr();
    a.v = vb.data_ptr();
    a.seq_q = suffix_seq_q.data_ptr<int32_t>();
    a.seq_kv = suffix_seq_kv.data_ptr<int32_t>();
    a.o = out_suffix.data_ptr();
    a.stats = stats_suffix.data_ptr<float>();
    cudnn_sdpa_forward(problems.suffix, a, workspaces.allocator(), stream);
    if (prefix_queries) {
      // Zeros: the rows past prefix_seq_q (padded queries, dead) are not computed, and later layers' amax passes
      // and weight-gradient GEMMs read every row, so they must hold finite values.
      out_prefix = at::zeros({batch * prefix_len, h, d}, q.options());
      stats_prefix = at::empty({batch, h, prefix_len}, f32);
      a.q = q.data_ptr();
      a.k = element_ptr(kb, problems.prefix_k_offset);
      a.v = element_ptr(vb, problems.prefix_k_offset);
      a.seq_q = prefix_seq_q.data_ptr<int32_t>();
      a.seq_kv = prefix_seq_kv.data_ptr<int32_t>();
      a.o = out_prefix.data_ptr();
      a.stats = stats_prefix.data_ptr<float>();
      cudnn_sdpa_forward(problems.prefix, a, workspaces.allocator(), stream);
    }
    // The key buffers are gathered again in backward (12.5 MB each) rather than kept.
    ctx->save_for_backward({q, k, v, out_prefix, out_suffix, stats_prefix, stats_suffix, kv_order, kv_grad_slot,
                            prefix_seq_q, prefix_seq_kv, suffix_seq_q, suffix_seq_kv});
    ctx->saved_data["batch"] = batch;
    ctx->saved_data["prefix_len"] = prefix_len;
    ctx->saved_data["suffix_len"] = suffix_len;
    ctx->saved_data["scale"] = scale;
    if (prefix_queries) return {out_prefix, out_suffix};
    return {out_suffix};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out_prefix = saved[3], &out_suffix = saved[4];
    const at::Tensor &stats_prefix = saved[5], &stats_suffix = saved[6], &kv_order = saved[7];
    const at::Tensor &kv_grad_slot = saved[8], &prefix_seq_q = saved[9], &prefix_seq_kv = saved[10];
    const at::Tensor &suffix_seq_q = saved[11], &suffix_seq_kv = saved[12];
    const int64_t batch = ctx->saved_data["batch"].toInt(), p = ctx->saved_data["prefix_len"].toInt();
    const int64_t s = ctx->saved_data["suffix_len"].toInt(), n = p + s, hk = k.size(1), d = k.size(2);
    const JointAttentionShape shape{batch, p, s, q.size(1), hk, d, ctx->saved_data["scale"].toDouble()};
    const bool prefix_queries = stats_prefix.defined();
    const JointProblems problems = joint_problems(shape, prefix_queries);
    // A branch whose output fed nothing differentiable gets an undefined gradient: zeros then.
    auto grad_of = [&](size_t i, const at::Tensor& out) {
      return grads[i].defined() ? grads[i].contiguous() : at::zeros_like(out);
    };
    const at::Tensor d_suffix = grad_of(prefix_queries ? 1 : 0, out_suffix);
    const at::Tensor kb = k.index_select(0, kv_order), vb = v.index_select(0, kv_order);
    // Zeros: the padded prefix queries past prefix_seq_q get no gradient from cuDNN (it is zero: they are dead).
    at::Tensor dq = prefix_queries ? at::zeros_like(q) : at::empty_like(q);
    // One extra row: the zero gradient of padded keys (kv_grad_slot points them there).
    at::Tensor dkb = at::empty({batch * n + 1, hk, d}, k.options()), dvb = at::empty_like(dkb);
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    SdpaWorkspaces workspaces(q.options());
    SdpaBackwardArgs a;
    a.q = element_ptr(q, problems.suffix_q_offset);
    a.k = kb.data_ptr();
    a.v = vb.data_ptr();
    a.o = out_suffix.data_ptr();
    a.d_o = d_suffix.data_ptr();
    a.stats = stats_suffix.data_ptr<float>();
    a.seq_q = suffix_seq_q.data_ptr<int32_t>();
    a.seq_kv = suffix_seq_kv.data_ptr<int32_t>();
    a.dq = element_ptr(dq, problems.suffix_q_offset);
    a.dk = dkb.data_ptr();
    a.dv = dvb.data_ptr();
    cudnn_sdpa_backward(problems.suffix, a, workspaces.allocator(), stream);
    if (prefix_queries) {
      const at::Tensor d_prefix = grad_of(0, out_prefix);
      at::Tensor dkp = at::empty({batch * p, hk, d}, k.options()), dvp = at::empty_like(dkp);
      a.q = q.data_ptr();
      a.k = element_ptr(kb, problems.prefix_k_offset);
      a.v = element_ptr(vb, problems.prefix_k_offset);
      a.o = out_prefix.data_ptr();
      a.d_o = d_prefix.data_ptr();
      a.stats = stats_prefix.data_ptr<float>();
      a.seq_q = prefix_seq_q.data_ptr<int32_t>();
      a.seq_kv = prefix_seq_kv.data_ptr<int32_t>();
      a.dq = dq.data_ptr();
      a.dk = dkp.data_ptr();
      a.dv = dvp.data_ptr();
      cudnn_sdpa_backward(problems.prefix, a, workspaces.allocator(), stream);
      // A valid prefix key serves both calls: its gradient is the sum (padded rows: garbage, never read).
      auto prefix_rows = [&](const at::Tensor& buffer) {
        return buffer.narrow(0, 0, batch * n).view({batch, n, hk * d}).narrow(1, s, p);
      };
      prefix_rows(dkb).add_(dkp.view({batch, p, hk * d}));
      prefix_rows(dvb).add_(dvp.view({batch, p, hk * d}));
    }
    dkb.narrow(0, batch * n, 1).zero_();
    dvb.narrow(0, batch * n, 1).zero_();
    variable_list result(13);
    result[0] = dq;
    result[1] = dkb.index_select(0, kv_grad_slot);
    result[2] = dvb.index_select(0, kv_grad_slot);
    return result;
  }
};
#endif

}  // namespace

VarlenLayout joint_varlen_layout(const at::Tensor& valid, int64_t prefix_len, bool prefix_queries,
                                 VarlenBackend backend) {
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
  layout.backend = backend;
  layout.rows_k = b * n;
  layout.rows_q = prefix_queries ? b * n : b * s;
  layout.batch = b;
  layout.prefix_len = p;
  layout.suffix_len = s;
  if (backend == VarlenBackend::kCudnn) {
    if (p == 0 || s == 0)
      fail("the cuDNN layout needs prefix and suffix positions (P " + std::to_string(p) + ", S " + std::to_string(s) +
           ")");
    // Within sample b: suffix key j at buffer row j, the r-th valid prefix key at S + r, the r-th padded one at
    // S + valid + r.
    const at::Tensor padded_rank = vp.logical_not().to(at::kLong).cumsum(1) - 1;
    const at::Tensor prefix_dest = at::where(vp, rank + s, padded_rank + lp.unsqueeze(1) + s);
    const at::Tensor dest = at::cat({prefix_dest, at::arange(s, longs).unsqueeze(0).expand({b, s})}, 1) + first_row;
    layout.kv_order = at::empty({b * n}, longs);
    layout.kv_order.index_put_({dest.reshape({-1})}, at::arange(b * n, longs));
    const at::Tensor key_valid = at::cat({vp, at::ones({b, s}, valid.options())}, 1);
    layout.kv_grad_slot = at::where(key_valid, dest, b * n).reshape({-1});
    const auto ints = valid.options().dtype(at::kInt);
    // A sample's prefix queries up to its last valid prefix position; those after it (text padding) are dead
    // rows that cuDNN then skips.
    layout.prefix_seq_q = (vp.to(at::kInt) * at::arange(1, p + 1, ints)).amax(1).clamp_min(1).to(at::kInt);
    layout.prefix_seq_kv = lp.to(at::kInt);
    layout.suffix_seq_q = at::full({b}, s, ints);
    layout.suffix_seq_kv = (lp + s).to(at::kInt);
    layout.max_q = prefix_queries ? std::max(p, s) : s;
    layout.max_k = n;
    return layout;
  }
  at::Tensor key_counts;  // per sequence, in order
  int64_t capacity = 0;
  if (prefix_queries) {
    key_counts = at::stack({lp, lp + s}, 1).reshape({2 * b});
    capacity = 2 * b * p + b * s;
    layout.cu_q =
        at::cat({(first_row + (at::arange(2, longs) * p).unsqueeze(0)).reshape({2 * b}), at::full({1}, b * n, longs)})
            .to(at::kInt);
    layout.max_q = std::max(p, s);
  } else {
    key_counts = lp + s;
    capacity = b * n;
    layout.cu_q = (at::arange(b + 1, longs) * s).to(at::kInt);
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

VarlenLayout suffix_queries_layout(const VarlenLayout& with_prefix_queries, const at::Tensor& valid) {
  const VarlenLayout& joint = with_prefix_queries;
  if (joint.rows_q != joint.rows_k) fail("suffix_queries_layout takes a layout with prefix queries");
  if (joint.backend != VarlenBackend::kCudnn)
    return joint_varlen_layout(valid, joint.prefix_len, /*prefix_queries=*/false, joint.backend);
  VarlenLayout out = joint;
  out.rows_q = joint.batch * joint.suffix_len;
  out.max_q = joint.suffix_len;
  return out;
}

bool varlen_attention_supported(const at::Tensor& x, int64_t head_dim, AttentionBackend backend) {
#ifdef VLATUNE_HAVE_CUDA
  if (backend == AttentionBackend::kSdpa) return false;
  if (!x.defined() || !x.is_cuda() || (x.scalar_type() != at::kBFloat16 && x.scalar_type() != at::kHalf)) return false;
  if (head_dim <= 0 || head_dim % 8 != 0 || head_dim > 256) return false;
  return at::cuda::getDeviceProperties(x.device().index())->major >= 8;
#else
  (void)x;
  (void)head_dim;
  (void)backend;
  return false;
#endif
}

const char* to_string(VarlenBackend backend) {
  return backend == VarlenBackend::kCudnn ? "cudnn" : "flash";
}

VarlenBackend choose_varlen_backend(const at::Tensor& x, const JointAttentionShape& shape, AttentionBackend backend) {
  if (backend == AttentionBackend::kFlash) return VarlenBackend::kFlash;
  std::string why;
#ifdef VLATUNE_HAVE_CUDA
  if (!cudnn_sdpa_compiled()) {
    why = "this build has no cuDNN frontend";
  } else if (!x.is_cuda() || x.scalar_type() != at::kBFloat16) {
    why = "activations are not bf16 on CUDA";
  } else if (shape.prefix_len <= 0 || shape.suffix_len <= 0) {
    why = "no prefix or no suffix positions";
  } else {
    const int device = x.device().index();
    for (bool prefix_queries : {true, false}) {  // cudnn_sdpa_check answers each problem once
      const JointProblems problems = joint_problems(shape, prefix_queries);
      why = cudnn_sdpa_check(problems.suffix, device);
      if (why.empty() && prefix_queries) why = cudnn_sdpa_check(problems.prefix, device);
      if (!why.empty()) break;
    }
    if (!why.empty() && backend != AttentionBackend::kCudnn) {
      static std::mutex mutex;
      static std::set<std::string> reported;  // the notice once per refusal (the reason names the problem)
      std::lock_guard<std::mutex> lock(mutex);
      if (reported.insert(why).second)
        std::cerr << "vlatune: cuDNN attention unavailable, FlashAttention-2 instead: " << why << "\n";
    }
  }
#else
  (void)x;
  (void)shape;
  why = "a build without CUDA";
#endif
  if (why.empty()) return VarlenBackend::kCudnn;
  if (backend == AttentionBackend::kCudnn)
    throw std::runtime_error("model_options.attention_backend \"cudnn\": " + why);
  return VarlenBackend::kFlash;
}

std::vector<at::Tensor> varlen_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                         const VarlenLayout& layout, double scale) {
  if (q.dim() != 3 || k.dim() != 3 || v.sizes() != k.sizes() || q.size(2) != k.size(2) || k.size(1) == 0 ||
      q.size(1) % k.size(1) != 0)
    fail("q must be [rows, H, D] and k, v [rows, Hk, D] with H a multiple of Hk");
  if (q.size(0) != layout.rows_q || k.size(0) != layout.rows_k)
    fail("rows " + std::to_string(q.size(0)) + " / " + std::to_string(k.size(0)) + " do not match the layout's " +
         std::to_string(layout.rows_q) + " / " + std::to_string(layout.rows_k));
  if (!q.is_contiguous() || !k.is_contiguous() || !v.is_contiguous()) fail("q, k and v must be contiguous");
  const bool prefix_queries = layout.rows_q == layout.rows_k;
  if (layout.backend == VarlenBackend::kCudnn) {
#ifdef VLATUNE_HAVE_CUDA
    if (q.scalar_type() != at::kBFloat16) fail("the cuDNN backend takes bf16 activations");
    return CudnnJointAttentionFn::apply(q, k, v, layout.kv_order, layout.kv_grad_slot, layout.prefix_seq_q,
                                        layout.prefix_seq_kv, layout.suffix_seq_q, layout.suffix_seq_kv, layout.batch,
                                        layout.prefix_len, layout.suffix_len, scale);
#else
    fail("the cuDNN backend needs a CUDA build");
#endif
  }
  // autograd's input bookkeeping needs defined tensors: no second slot is an empty one.
  const at::Tensor second_slot = layout.second_slot.defined() ? layout.second_slot : layout.first_slot.new_empty({0});
  const at::Tensor out = VarlenAttentionFn::apply(q, k, v, layout.gather, layout.first_slot, second_slot, layout.cu_q,
                                                  layout.cu_k, layout.slots, layout.max_q, layout.max_k, scale);
  if (!prefix_queries) return {out};
  // Per branch: views of the token-major output (the caller's reshape copies them).
  const int64_t b = layout.batch, p = layout.prefix_len, s = layout.suffix_len;
  auto parts = out.view({b, p + s, q.size(1), q.size(2)}).split_with_sizes({p, s}, 1);
  return {parts[0], parts[1]};
}

}  // namespace vlatune::kernels
