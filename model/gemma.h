// Gemma weight sets and the joint layer (spec §3). The backbone ("language_model") and the action expert
// ("gemma_expert.model") are separate GemmaModel modules with openpi names; a *joint* layer i runs both
// branches together: per-branch norms and Q/K/V, one attention over [prefix; suffix], per-branch o_proj,
// residuals and GeGLU MLPs. Prefix norms are RMSNorm (1 + w); expert norms are adaRMS with gated residuals.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "kernels/varlen_attention.h"
#include "model/config.h"
#include "model/layers.h"

namespace vlatune::model {

// q/k/v/o without bias; q: width -> heads*head_dim, k/v: width -> kv_heads*head_dim, o: heads*head_dim -> width.
class GemmaAttentionImpl : public ScopedModule {
 public:
  GemmaAttentionImpl(const GemmaConfig& cfg, torch::TensorOptions options);
  Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  int64_t heads, kv_heads, head_dim;
};
TORCH_MODULE(GemmaAttention);

// GeGLU: down(gelu_tanh(gate(x)) * up(x)), no biases.
class GemmaMLPImpl : public ScopedModule {
 public:
  GemmaMLPImpl(const GemmaConfig& cfg, torch::TensorOptions options);
  // recompute_gate_up: the recompute unit `<mlp>.gate_proj+up_proj` (the merged gate+up GEMM output is not kept
  // from forward to backward but computed again at the start of the MLP's backward; same GEMM, same inputs, so
  // identical gradients). Reference path: gate_proj and up_proj run under model::recompute().
  // fused: gate_proj and up_proj as one GEMM (in this module's scope), GeGLU and down_proj as one autograd node that
  // keeps only the merged GEMM output for backward (kernels::geglu_linear; down_proj keeps its scope); with
  // recompute_gate_up it keeps the GEMM's input instead (bf16: the normed activation x, which the GEMM's own node
  // keeps for the weight gradient; FP8: that node's x_q^T) and rebuilds the output in backward.
  torch::Tensor forward(const torch::Tensor& x, bool recompute_gate_up = false, bool fused = false);
  Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};

 private:
  torch::Tensor forward_merged(const torch::Tensor& x, bool recompute_gate_up);
};
TORCH_MODULE(GemmaMLP);

// Norm output of one branch: y and, for adaRMS, the residual gate ([B, 1, width]); undefined for RMSNorm.
// h: the residual stream the norm read (after the residual add fused into it, on the fused path).
struct NormOutput {
  torch::Tensor y, gate, h;
};

// One branch's layer weights. `adaptive`: the expert (adaRMS norms conditioned on a cond_dim vector).
class GemmaDecoderLayerImpl : public ScopedModule {
 public:
  GemmaDecoderLayerImpl(const GemmaConfig& cfg, bool adaptive, int64_t cond_dim, torch::TensorOptions options);
  // The pre-attention norm, and the attention residual fused into the pre-FFN norm (prefix: h = x + attn; expert:
  // h = x + gate * attn, gate from the pre-attention adaRMS), on `path` (kernels/fused_ops.h).
  NormOutput pre_attention_norm(const torch::Tensor& x, const torch::Tensor& cond, kernels::OpPath path);
  NormOutput residual_pre_ffn_norm(const torch::Tensor& x, const torch::Tensor& attn, const torch::Tensor& attn_gate,
                                   const torch::Tensor& cond, kernels::OpPath path);
  GemmaAttention self_attn{nullptr};
  GemmaMLP mlp{nullptr};
  // "input_layernorm" / "post_attention_layernorm" (both are *pre*-norms: before attention, before the MLP).
  RMSNorm input_rms{nullptr}, post_attention_rms{nullptr};     // prefix
  AdaRMSNorm input_ada{nullptr}, post_attention_ada{nullptr};  // expert
};
TORCH_MODULE(GemmaDecoderLayer);

// "language_model" (with embed_tokens) or the expert's "model" (vocab 0: no embed_tokens).
class GemmaModelImpl : public ScopedModule {
 public:
  GemmaModelImpl(const GemmaConfig& cfg, bool adaptive, int64_t cond_dim, torch::TensorOptions options);
  NormOutput final_norm(const torch::Tensor& x, const torch::Tensor& cond,
                        kernels::OpPath path = kernels::OpPath::kReference);
  Embedding embed_tokens{nullptr};             // null for the expert
  torch::nn::ModuleList layers_list{nullptr};  // registered as "layers"
  std::vector<GemmaDecoderLayer> layers;
  RMSNorm norm_rms{nullptr};     // "norm" (prefix)
  AdaRMSNorm norm_ada{nullptr};  // "norm" (expert)
};
TORCH_MODULE(GemmaModel);

// Inputs shared by every joint layer of one forward.
struct JointInputs {
  torch::Tensor cond;      // [B, cond_dim], compute dtype: the time condition c
  torch::Tensor cos, sin;  // [B, 1, N, head_dim/2], math dtype: RoPE of positions cumsum(valid) - 1
  torch::Tensor mask;      // [B, 1, N, N] bool: query i may attend key j
  Attention attention = Attention::kLean;
  bool fused = false;  // the fused kernels and merged GEMMs (ForwardOptions::kernels resolved for the device)
  // Set (fused, lean, kernels::varlen_attention_supported): the mask as varlen sequences, for layers with prefix
  // queries and for the last layer's suffix queries alone; the attention then reads no mask tensor.
  std::shared_ptr<const kernels::VarlenLayout> varlen_joint, varlen_suffix;
  // Set (ForwardOptions::skip_padded_rows, live_prefix_rows): the prefix stream is [R, Wp], the live rows only;
  // the prefix Q/K/V GEMM outputs are spread over all B * P positions for the attention (zero elsewhere) and the
  // prefix attention output's live rows gathered back for o_proj. Unset: the prefix stream is [B, P, Wp].
  torch::Tensor live_rows, live_slots;  // int64 [R] and [B * P] (LivePrefixRows)
  int64_t prefix_len = 0;               // P (set with the live rows: the stream no longer shows it)
};

// The prefix rows worth computing: every valid row of `prefix_valid` ([B, P] bool) in order, then the first padded
// rows up to a multiple of `multiple` (whole GEMM tiles; dead rows, distinct). rows: int64 [R], flattened [B * P]
// indices; slots: int64 [B * P], a row's place in `rows` (R or more for a row left out). Both undefined when that
// leaves out no row. `valid_count`: prefix_valid.sum() where the caller knows it on the host; unset, it is read
// back (a sync).
struct LivePrefixRows {
  torch::Tensor rows, slots;
};
LivePrefixRows live_prefix_rows(const torch::Tensor& prefix_valid, int64_t multiple,
                                std::optional<int64_t> valid_count = std::nullopt);

// RoPE tables for positions [B, N]: theta_i = pos / 10000^(2i/head_dim), i < head_dim/2, in `math`.
std::pair<torch::Tensor, torch::Tensor> rope_tables(const torch::Tensor& positions, int64_t head_dim,
                                                    c10::ScalarType math);

// Joint attention block of one layer (the "self_attn" unit): norm outputs -> o_proj outputs. xp [B, P, Wp] (with
// live rows: [R, Wp]), xs [B, S, Ws]. Returns {attn_p (xp's shape), attn_s [B, S, Ws]}; with skip_prefix only {attn_s}:
// prefix queries, their attention rows and the prefix o_proj are skipped (the prefix K/V are still computed).
std::vector<torch::Tensor> joint_attention(GemmaDecoderLayerImpl& prefix, GemmaDecoderLayerImpl& expert,
                                           const torch::Tensor& xp, const torch::Tensor& xs, const JointInputs& in,
                                           bool skip_prefix);

struct JointLayerOptions {
  bool skip_prefix = false;  // last layer, skip_dead: only what reaches the suffix
  bool recompute_attention = false;
  bool recompute_prefix_mlp = false;
  bool recompute_expert_mlp = false;
  bool recompute_prefix_gate_up = false;  // the prefix MLP's merged gate+up output (GemmaMLPImpl::forward)
};

// One joint layer: (hp, hs) -> {hp', hs'}; with skip_prefix -> {hs'} (hp only feeds the prefix K/V).
std::vector<torch::Tensor> joint_layer(GemmaDecoderLayerImpl& prefix, GemmaDecoderLayerImpl& expert,
                                       const torch::Tensor& hp, const torch::Tensor& hs, const JointInputs& in,
                                       const JointLayerOptions& options);

}  // namespace vlatune::model
