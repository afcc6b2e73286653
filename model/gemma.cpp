#include "model/gemma.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/fused_ops.h"
#include "model/float8_linear.h"
#include "model/merged_gemm.h"
#include "model/recompute.h"
#include "profiler/scope.h"

namespace vlatune::model {

namespace {
constexpr double kRmsEps = 1e-6;
constexpr double kRopeBase = 10000.0;

// down_proj's adapter on the fused path, from the merged gate+up output: (alpha / rank) (geglu(merged) A^T) B^T,
// the first GEMM through kernels::geglu_linear so that geglu(merged) is rebuilt in backward, not kept.
torch::Tensor down_lora(const LinearImpl& down, const torch::Tensor& merged, const kernels::MergedRebuild* rebuild) {
  profiler::Scope scope(down.fqn());
  const torch::Tensor z =
      kernels::geglu_linear(merged, down.lora_A.to(merged.scalar_type()), torch::Tensor(), "", rebuild) *
      down.lora_scale();
  return at::linear(z, down.lora_B.to(z.scalar_type()));
}

std::vector<torch::Tensor> concat(std::vector<torch::Tensor> a, const std::vector<torch::Tensor>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace

LivePrefixRows live_prefix_rows(const torch::Tensor& prefix_valid, int64_t multiple,
                                std::optional<int64_t> valid_count) {
  if (!prefix_valid.defined() || prefix_valid.dim() != 2 || prefix_valid.scalar_type() != torch::kBool)
    throw std::invalid_argument("live_prefix_rows: prefix_valid must be a [B, P] bool tensor");
  if (multiple < 1)
    throw std::invalid_argument("live_prefix_rows: multiple must be positive, got " + std::to_string(multiple));
  const torch::Tensor flat = prefix_valid.reshape({-1});
  const int64_t n = flat.size(0);
  const int64_t valid = valid_count ? *valid_count : flat.sum().item<int64_t>();
  if (valid < 0 || valid > n)
    throw std::invalid_argument("live_prefix_rows: valid_count " + std::to_string(valid) + " is outside [0, " +
                                std::to_string(n) + "]");
  const int64_t live = std::min(n, (valid + multiple - 1) / multiple * multiple);
  if (live >= n) return {};
  // Valid rows first, then padded ones, each in row order (a stable sort on "is padded"); a row's slot is its
  // place in that order.
  const torch::Tensor order =
      std::get<1>(at::sort(flat.logical_not().to(torch::kUInt8), /*stable=*/std::optional<bool>(true), /*dim=*/0));
  const torch::Tensor slots = torch::empty_like(order).scatter_(0, order, torch::arange(n, order.options()));
  return {order.narrow(0, 0, live), slots};
}

torch::Tensor merged_gemm(const torch::Tensor& x, std::initializer_list<const LinearImpl*> members,
                          kernels::MergedRebuild* rebuild) {
  std::vector<torch::Tensor> weights, biases;
  for (const LinearImpl* l : members) {
    weights.push_back(l->weight);
    if (l->bias.defined()) biases.push_back(l->bias);
  }
  if (!biases.empty() && biases.size() != weights.size())
    throw std::invalid_argument("merged_gemm: " + (*members.begin())->fqn() +
                                ": either every member has a bias or none has");
  if (!biases.empty() && rebuild != nullptr)
    throw std::invalid_argument("merged_gemm: " + (*members.begin())->fqn() + ": no rebuild of a GEMM with biases");
  torch::Tensor base;
  if (Float8State* fp8 = merged_fp8_state(members)) {
    base = float8_linear(x, weights, biases.empty() ? torch::Tensor() : torch::cat(biases), *fp8, rebuild);
  } else {
    if (rebuild != nullptr) *rebuild = kernels::merged_linear_rebuild(x, weights);
    base = kernels::merged_linear(x, weights, biases);
  }
  const torch::Tensor delta = merged_lora_delta(x, members, rebuild);
  return delta.defined() ? base + delta : base;
}

GemmaAttentionImpl::GemmaAttentionImpl(const GemmaConfig& cfg, torch::TensorOptions options)
    : heads(cfg.heads), kv_heads(cfg.kv_heads), head_dim(cfg.head_dim) {
  q_proj = register_module("q_proj", Linear(cfg.width, cfg.heads * cfg.head_dim, false, options));
  k_proj = register_module("k_proj", Linear(cfg.width, cfg.kv_heads * cfg.head_dim, false, options));
  v_proj = register_module("v_proj", Linear(cfg.width, cfg.kv_heads * cfg.head_dim, false, options));
  o_proj = register_module("o_proj", Linear(cfg.heads * cfg.head_dim, cfg.width, false, options));
}

GemmaMLPImpl::GemmaMLPImpl(const GemmaConfig& cfg, torch::TensorOptions options) {
  gate_proj = register_module("gate_proj", Linear(cfg.width, cfg.mlp, false, options));
  up_proj = register_module("up_proj", Linear(cfg.width, cfg.mlp, false, options));
  down_proj = register_module("down_proj", Linear(cfg.mlp, cfg.width, false, options));
}

torch::Tensor GemmaMLPImpl::forward(const torch::Tensor& x, bool recompute_gate_up, bool fused) {
  profiler::Scope scope(fqn());
  if (fused) return forward_merged(x, recompute_gate_up);
  if (!recompute_gate_up) return down_proj(gelu_tanh(gate_proj(x)) * up_proj(x));
  // The unit `mlp.gate_proj+up_proj` on the reference path: the two projections as one checkpointed call (they
  // are re-run in backward; the elementwise ops after them still keep their inputs, so this path saves no memory:
  // it exists so that every path accepts the unit with the same results).
  GemmaMLPImpl* m = this;
  auto gate_up = recompute(
      [m](const std::vector<torch::Tensor>& in) {
        return std::vector<torch::Tensor>{m->gate_proj(in[0]), m->up_proj(in[0])};
      },
      {x}, concat(gate_proj->parameters(), up_proj->parameters()));
  return down_proj(gelu_tanh(gate_up[0]) * gate_up[1]);
}

torch::Tensor GemmaMLPImpl::forward_merged(const torch::Tensor& x, bool recompute_gate_up) {
  if (profiler::scopes_enabled()) {
    const int64_t rows = x.numel() / x.size(-1);
    profiler::note_gemm({&gate_proj->fqn(), &up_proj->fqn()}, rows, x.size(-1), 2 * gate_proj->weight.size(0));
    profiler::note_gemm({&down_proj->fqn()}, rows, down_proj->weight.size(1), down_proj->weight.size(0));
  }
  if (!recompute_gate_up) {
    auto merged = merged_gemm(x, {gate_proj.get(), up_proj.get()});  // [.., gate | up]
    if (down_proj->fp8)
      return float8_geglu_linear(merged, down_proj->weight, *down_proj->fp8, down_proj->fqn(), nullptr,
                                 merged_fp8_state({gate_proj.get(), up_proj.get()}));
    auto y = kernels::geglu_linear(merged, down_proj->weight, torch::Tensor(), down_proj->fqn());
    return down_proj->has_lora() ? y + down_lora(*down_proj, merged, nullptr) : y;
  }
  // The unit `mlp.gate_proj+up_proj`: the GeGLU node keeps what rebuilds the merged output (the GEMM's input, or
  // its FP8 copy, which the GEMM's node keeps anyway) instead of the output, and runs the GEMM again at the start
  // of its backward, in this module's scope and the recompute phase.
  kernels::MergedRebuild rebuild;
  auto merged = merged_gemm(x, {gate_proj.get(), up_proj.get()}, &rebuild);
  rebuild.fn = [inner = std::move(rebuild.fn), scope_fqn = fqn()](const std::vector<torch::Tensor>& saved) {
    profiler::RecomputePhaseGuard phase;
    profiler::Scope scope(scope_fqn);
    return inner(saved);
  };
  if (down_proj->fp8)
    return float8_geglu_linear(merged, down_proj->weight, *down_proj->fp8, down_proj->fqn(), &rebuild,
                               merged_fp8_state({gate_proj.get(), up_proj.get()}));
  auto y = kernels::geglu_linear(merged, down_proj->weight, torch::Tensor(), down_proj->fqn(), &rebuild);
  return down_proj->has_lora() ? y + down_lora(*down_proj, merged, &rebuild) : y;
}

GemmaDecoderLayerImpl::GemmaDecoderLayerImpl(const GemmaConfig& cfg, bool adaptive, int64_t cond_dim,
                                             torch::TensorOptions options) {
  self_attn = register_module("self_attn", GemmaAttention(cfg, options));
  mlp = register_module("mlp", GemmaMLP(cfg, options));
  if (adaptive) {
    input_ada = register_module("input_layernorm", AdaRMSNorm(cfg.width, cond_dim, kRmsEps, options));
    post_attention_ada = register_module("post_attention_layernorm", AdaRMSNorm(cfg.width, cond_dim, kRmsEps, options));
  } else {
    input_rms = register_module("input_layernorm", RMSNorm(cfg.width, kRmsEps, options));
    post_attention_rms = register_module("post_attention_layernorm", RMSNorm(cfg.width, kRmsEps, options));
  }
}

NormOutput GemmaDecoderLayerImpl::pre_attention_norm(const torch::Tensor& x, const torch::Tensor& cond,
                                                     kernels::OpPath path) {
  if (input_ada) {
    auto out = input_ada->forward(x, cond, torch::Tensor(), torch::Tensor(), path);
    return {out.y, out.gate, out.h};
  }
  auto out = input_rms->forward(x, torch::Tensor(), path);
  return {out.y, torch::Tensor(), out.h};
}

NormOutput GemmaDecoderLayerImpl::residual_pre_ffn_norm(const torch::Tensor& x, const torch::Tensor& attn,
                                                        const torch::Tensor& attn_gate, const torch::Tensor& cond,
                                                        kernels::OpPath path) {
  if (post_attention_ada) {
    auto out = post_attention_ada->forward(x, cond, attn, attn_gate, path);
    return {out.y, out.gate, out.h};
  }
  auto out = post_attention_rms->forward(x, attn, path);
  return {out.y, torch::Tensor(), out.h};
}

GemmaModelImpl::GemmaModelImpl(const GemmaConfig& cfg, bool adaptive, int64_t cond_dim, torch::TensorOptions options) {
  if (cfg.vocab > 0) embed_tokens = register_module("embed_tokens", Embedding(cfg.vocab, cfg.width, options));
  layers_list = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < cfg.depth; ++i) {
    layers.push_back(GemmaDecoderLayer(cfg, adaptive, cond_dim, options));
    layers_list->push_back(layers.back());
  }
  if (adaptive) {
    norm_ada = register_module("norm", AdaRMSNorm(cfg.width, cond_dim, kRmsEps, options));
  } else {
    norm_rms = register_module("norm", RMSNorm(cfg.width, kRmsEps, options));
  }
}

NormOutput GemmaModelImpl::final_norm(const torch::Tensor& x, const torch::Tensor& cond, kernels::OpPath path) {
  if (norm_ada) {
    auto out = norm_ada->forward(x, cond, torch::Tensor(), torch::Tensor(), path);
    return {out.y, out.gate, out.h};
  }
  auto out = norm_rms->forward(x, torch::Tensor(), path);
  return {out.y, torch::Tensor(), out.h};
}

std::pair<torch::Tensor, torch::Tensor> rope_tables(const torch::Tensor& positions, int64_t head_dim,
                                                    c10::ScalarType math) {
  const int64_t half = head_dim / 2;
  auto options = torch::TensorOptions().dtype(math).device(positions.device());
  auto inv_timescale = torch::pow(kRopeBase, torch::arange(half, options) * (2.0 / head_dim)).reciprocal();
  auto angles = (positions.to(math).unsqueeze(-1) * inv_timescale).unsqueeze(1);  // [B, 1, N, half]
  return {angles.cos(), angles.sin()};
}

std::vector<torch::Tensor> joint_attention(GemmaDecoderLayerImpl& prefix, GemmaDecoderLayerImpl& expert,
                                           const torch::Tensor& xp, const torch::Tensor& xs, const JointInputs& in,
                                           bool skip_prefix) {
  // The joint attention core is attributed to the backbone's self_attn; each projection opens its own scope.
  profiler::Scope scope(prefix.self_attn->fqn());
  GemmaAttentionImpl& ap = *prefix.self_attn;
  GemmaAttentionImpl& ae = *expert.self_attn;
  const bool live = in.live_rows.defined();
  const int64_t batch = xs.size(0), p = live ? in.prefix_len : xp.size(1), s = xs.size(1);
  const int64_t heads = ap.heads, kv_heads = ap.kv_heads, d = ap.head_dim;
  auto split = [&](const torch::Tensor& y, int64_t t, int64_t h) {  // [B, T, h*d] -> [B, h, T, d]
    return y.view({batch, t, h, d}).transpose(1, 2);
  };
  // With live rows: a prefix projection's rows at every prefix position ([R, c] -> [B, P, c], zero where the stream
  // keeps no row: never a key, and a dead query), and the prefix attention output back to the stream's rows.
  auto all_positions = [&](const torch::Tensor& y) {
    return live ? kernels::spread_rows(y, in.live_rows, in.live_slots, {batch, p, y.size(-1)}) : y;
  };
  auto stream_rows = [&](const torch::Tensor& o) {
    return live ? kernels::gather_rows(o, in.live_rows, in.live_slots) : o;
  };
  if (in.fused) {
    // Q, K and V of a branch as one GEMM against [q_proj; k_proj; v_proj] (the last layer's skipped prefix
    // queries: [k_proj; v_proj]), attributed to that branch's self_attn scope (no per-projection scopes on this
    // path); then split, concatenation and RoPE in one kernel.
    torch::Tensor qkv_s, qkv_p;
    if (profiler::scopes_enabled()) {
      auto n_of = [](const LinearImpl& l) { return l.weight.size(0); };
      const int64_t rows_s = xs.numel() / xs.size(-1), rows_p = xp.numel() / xp.size(-1);
      profiler::note_gemm({&ae.q_proj->fqn(), &ae.k_proj->fqn(), &ae.v_proj->fqn()}, rows_s, xs.size(-1),
                          n_of(*ae.q_proj) + n_of(*ae.k_proj) + n_of(*ae.v_proj));
      if (skip_prefix)
        profiler::note_gemm({&ap.k_proj->fqn(), &ap.v_proj->fqn()}, rows_p, xp.size(-1),
                            n_of(*ap.k_proj) + n_of(*ap.v_proj));
      else
        profiler::note_gemm({&ap.q_proj->fqn(), &ap.k_proj->fqn(), &ap.v_proj->fqn()}, rows_p, xp.size(-1),
                            n_of(*ap.q_proj) + n_of(*ap.k_proj) + n_of(*ap.v_proj));
    }
    {
      profiler::Scope expert_scope(ae.fqn());
      qkv_s = merged_gemm(xs, {ae.q_proj.get(), ae.k_proj.get(), ae.v_proj.get()});
    }
    qkv_p = all_positions(skip_prefix ? merged_gemm(xp, {ap.k_proj.get(), ap.v_proj.get()})
                                      : merged_gemm(xp, {ap.q_proj.get(), ap.k_proj.get(), ap.v_proj.get()}));
    auto qkv = kernels::rope_qkv(qkv_p, qkv_s, in.cos, in.sin, heads, kv_heads, /*prefix_q=*/!skip_prefix);
    // The attention output per branch, [B, T, heads, D] in any layout: varlen gives the branches (cuDNN: each
    // contiguous, so each o_proj input is a view; FlashAttention-2: views of one token-major output, copied by the
    // reshape). The varlen rows [B * T, h, D] are views of the rope kernel's buffers. SDPA's output takes q's
    // layout, so its transpose is a view; each branch is then made contiguous by one copy (narrowing the reshaped
    // output copied the prefix rows a second time), and the backward is one cat instead of two zero-filled slice
    // gradients and their sum.
    std::vector<torch::Tensor> branches;
    if (const kernels::VarlenLayout* varlen = skip_prefix ? in.varlen_suffix.get() : in.varlen_joint.get()) {
      auto rows = [](const torch::Tensor& t) {
        auto token_major = t.transpose(1, 2);
        return token_major.reshape({-1, token_major.size(2), token_major.size(3)});
      };
      branches = kernels::varlen_attention(rows(qkv.q), rows(qkv.k), rows(qkv.v), *varlen,
                                           1.0 / std::sqrt(static_cast<double>(d)));
    } else {
      auto o = attention_core(qkv.q, qkv.k, qkv.v, skip_prefix ? in.mask.narrow(2, p, s) : in.mask, in.attention)
                   .transpose(1, 2);
      branches = skip_prefix ? std::vector<torch::Tensor>{o} : o.split_with_sizes({p, s}, 1);
    }
    if (skip_prefix) return {ae.o_proj(branches[0].reshape({batch, s, heads * d}))};
    return {ap.o_proj(stream_rows(branches[0].reshape({batch, p, heads * d}))),
            ae.o_proj(branches[1].reshape({batch, s, heads * d}))};
  }
  // Concatenate along the sequence, prefix first (spec §3 step 3), then RoPE on the joint positions.
  auto k = kernels::apply_rope_ref(
      at::cat({split(all_positions(ap.k_proj(xp)), p, kv_heads), split(ae.k_proj(xs), s, kv_heads)}, 2), in.cos,
      in.sin);
  auto v = at::cat({split(all_positions(ap.v_proj(xp)), p, kv_heads), split(ae.v_proj(xs), s, kv_heads)}, 2);
  if (skip_prefix) {
    auto q = kernels::apply_rope_ref(split(ae.q_proj(xs), s, heads), in.cos.narrow(2, p, s), in.sin.narrow(2, p, s));
    auto o = attention_core(q, k, v, in.mask.narrow(2, p, s), in.attention);
    return {ae.o_proj(o.transpose(1, 2).reshape({batch, s, heads * d}))};
  }
  auto q = kernels::apply_rope_ref(
      at::cat({split(all_positions(ap.q_proj(xp)), p, heads), split(ae.q_proj(xs), s, heads)}, 2), in.cos, in.sin);
  auto o = attention_core(q, k, v, in.mask, in.attention).transpose(1, 2).reshape({batch, p + s, heads * d});
  return {ap.o_proj(stream_rows(o.narrow(1, 0, p))), ae.o_proj(o.narrow(1, p, s))};
}

std::vector<torch::Tensor> joint_layer(GemmaDecoderLayerImpl& prefix, GemmaDecoderLayerImpl& expert,
                                       const torch::Tensor& hp, const torch::Tensor& hs, const JointInputs& in,
                                       const JointLayerOptions& options) {
  // The joint layer opens the backbone layer's scope; the expert-only part below opens the expert layer's.
  profiler::Scope scope(prefix.fqn());
  const bool skip = options.skip_prefix;
  const bool fused = in.fused;
  const kernels::OpPath path = fused ? kernels::OpPath::kFused : kernels::OpPath::kReference;
  auto np = prefix.pre_attention_norm(hp, torch::Tensor(), path);
  auto ns = expert.pre_attention_norm(hs, in.cond, path);

  std::vector<torch::Tensor> attn;
  if (options.recompute_attention) {
    GemmaDecoderLayerImpl* pp = &prefix;
    GemmaDecoderLayerImpl* pe = &expert;
    attn = recompute(
        [pp, pe, skip, shared = in](const std::vector<torch::Tensor>& x) {
          JointInputs j = shared;  // the tensors the recompute re-reads come from its inputs
          j.cos = x[2];
          j.sin = x[3];
          j.mask = x[4];
          return joint_attention(*pp, *pe, x[0], x[1], j, skip);
        },
        {np.y, ns.y, in.cos, in.sin, in.mask}, concat(prefix.self_attn->parameters(), expert.self_attn->parameters()));
  } else {
    attn = joint_attention(prefix, expert, np.y, ns.y, in, skip);
  }

  auto run_mlp = [fused](GemmaMLPImpl& mlp, const torch::Tensor& x, bool checkpointed, bool gate_up = false) {
    if (!checkpointed) return mlp.forward(x, gate_up, fused);
    GemmaMLPImpl* m = &mlp;
    return recompute(
        [m, fused](const std::vector<torch::Tensor>& in) {
          return std::vector<torch::Tensor>{m->forward(in[0], false, fused)};
        },
        {x}, mlp.parameters())[0];
  };

  // Expert: gated residuals (raw gate, not 1 + gate), attributed to the expert layer's scope; the attention residual
  // runs inside the pre-FFN adaRMS (one kernel on the fused path).
  torch::Tensor hs_out;
  {
    profiler::Scope expert_scope(expert.fqn());
    NormOutput ns2 = expert.residual_pre_ffn_norm(ns.h, attn.back(), ns.gate, in.cond, path);
    hs_out = ns2.h + ns2.gate * run_mlp(*expert.mlp, ns2.y, options.recompute_expert_mlp);
  }
  if (skip) return {hs_out};

  // Prefix: plain residuals, the attention residual inside the pre-FFN RMSNorm. np.h: hp through the pre-attention
  // norm, whose backward kernel then adds this norm's gradient of hp (fused path). With live rows, all of it on the
  // stream's [R, Wp] rows.
  NormOutput np2 = prefix.residual_pre_ffn_norm(np.h, attn[0], torch::Tensor(), torch::Tensor(), path);
  return {np2.h + run_mlp(*prefix.mlp, np2.y, options.recompute_prefix_mlp, options.recompute_prefix_gate_up), hs_out};
}

}  // namespace vlatune::model
