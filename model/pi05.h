// Pi0.5 (openpi pi05): SigLIP + projector + Gemma-2B prefix, Gemma-300M action expert with adaRMS time
// conditioning, joint attention, flow-matching loss (spec §1-§7). named_parameters() yields exactly the openpi
// PyTorch state-dict names (spec §11.2) without the dead expert lm_head.
#pragma once

#include <string>
#include <vector>

#include <torch/torch.h>

#include "model/batch.h"
#include "model/config.h"
#include "model/float8_linear.h"
#include "model/gemma.h"
#include "model/layers.h"
#include "model/siglip.h"

namespace vlatune::model {

class MultiModalProjectorImpl : public ScopedModule {
 public:
  MultiModalProjectorImpl(int64_t in, int64_t out, torch::TensorOptions options);
  torch::Tensor forward(const torch::Tensor& x);  // one Linear, no activation; image scale 1
  Linear linear{nullptr};
};
TORCH_MODULE(MultiModalProjector);

// paligemma.model
class PaliGemmaModelImpl : public ScopedModule {
 public:
  PaliGemmaModelImpl(const Pi05Config& cfg, torch::TensorOptions options);
  SiglipVisionTower vision_tower{nullptr};
  MultiModalProjector multi_modal_projector{nullptr};
  GemmaModel language_model{nullptr};
};
TORCH_MODULE(PaliGemmaModel);

class PaliGemmaImpl : public ScopedModule {
 public:
  PaliGemmaImpl(const Pi05Config& cfg, torch::TensorOptions options);
  PaliGemmaModel model{nullptr};
};
TORCH_MODULE(PaliGemma);

class GemmaExpertImpl : public ScopedModule {
 public:
  GemmaExpertImpl(const Pi05Config& cfg, torch::TensorOptions options);
  GemmaModel model{nullptr};  // no embed_tokens, no lm_head
};
TORCH_MODULE(GemmaExpert);

class PaliGemmaWithExpertImpl : public ScopedModule {
 public:
  PaliGemmaWithExpertImpl(const Pi05Config& cfg, torch::TensorOptions options);
  PaliGemma paligemma{nullptr};
  GemmaExpert gemma_expert{nullptr};
};
TORCH_MODULE(PaliGemmaWithExpert);

class Pi05Impl : public ScopedModule {
 public:
  // Parameters are created zero (RMS scales 0 = identity scale, LayerNorm weight 1) on `device` in `dtype`:
  // call init_weights() or load a checkpoint. On torch::kMeta nothing is allocated.
  explicit Pi05Impl(const Pi05Config& cfg, torch::Device device = torch::kCPU, torch::Dtype dtype = torch::kFloat32);

  struct Output {
    torch::Tensor loss;                        // scalar
    torch::Tensor velocity;                    // [B, H, action_dim], fp32 (fp64 when the activations are fp64)
    std::vector<torch::Tensor> prefix_states;  // only with ForwardOptions::keep_prefix_states
  };
  // One flow-matching training forward. The batch must be on the parameters' device.
  Output forward(const Pi05Batch& batch, const ForwardOptions& options = {});

  // Activation checkpointing for exact module FQNs (patterns are resolved by the caller); replaces the previous
  // selection. Recomputable: the vision tower as a whole; each SigLIP encoder layer; each joint decoder layer,
  // named by either of its branches (`...language_model.layers.i` and `...gemma_expert.model.layers.i` both
  // select joint layer i, which runs both branches together); each joint attention block `...layers.i.self_attn`
  // (either name: norm outputs -> o_proj outputs of both branches, incl. q/k/v, RoPE, attention); each decoder
  // MLP `...layers.i.mlp` (prefix and expert separately); each backbone MLP's merged gate+up GEMM output
  // `...language_model.layers.i.mlp.gate_proj+up_proj` (named as the profiler's GEMM inventory names the merged
  // GEMM; not a module: the output is rebuilt by the same GEMM at the start of the MLP's backward, contained by
  // `...layers.i.mlp` and by joint layer i). The last backbone layer's units are listed like the others; with
  // skip_dead its prefix MLP does not run, so selecting them changes nothing. Throws std::invalid_argument naming
  // an unknown FQN, or both FQNs of a nested selection (a unit inside another selected one).
  void set_recompute(const std::vector<std::string>& fqns);
  std::vector<std::string> recomputable_fqns() const;
  const std::vector<std::string>& recompute_selection() const { return recompute_fqns_; }

  // FP8 GEMMs (model/float8_linear.h) for exact Linear FQNs (patterns are resolved by the caller); replaces the
  // previous selection, every selected Linear getting fresh state (amax histories). Merged GEMMs: selecting any of
  // a decoder layer's q_proj/k_proj/v_proj selects all three, gate_proj/up_proj both (the merged GEMM runs in
  // FP8 on the fused path; the selection is the same Linears on the reference path). Throws
  // std::invalid_argument naming an FQN that is not a Linear, a Linear whose in/out features are not multiples of
  // 16, or a Linear (or a merged GEMM's member) with a LoRA adapter (model/lora.h: the FP8 GeGLU's backward hands
  // gate+up its gradient outside autograd, which would bypass the adapters; so the two are exclusive).
  void set_fp8(const std::vector<std::string>& fqns, const Fp8Config& config = {});
  // The FP8 Linears (merged members included), in module order.
  std::vector<std::string> fp8_selection() const;

  // Packs the members of every merged GEMM into one buffer per group (model::pack_rows): per decoder layer and
  // branch q_proj/k_proj/v_proj weights (the last backbone layer's k_proj/v_proj, the group of its skipped-prefix
  // GEMM, are adjacent in it) and gate_proj/up_proj weights; per SigLIP encoder layer q/k/v weights and q/k/v
  // biases. The fused path then reads each stack as a view (no at::cat per step). Names, state dicts and
  // checkpoints are unchanged. Call it once the parameters are on their final device and dtype (after init or
  // a load, which copy in place anyway); Module::to() or anything else that replaces a member's storage undoes
  // it (still correct, slower): pack again. Returns the number of groups packed by this call (0: already packed).
  int64_t pack_merged_weights();
  // True when every merged group is packed.
  bool merged_weights_packed() const;

  // Parameters that got no gradient (the dead last-layer prefix work, unused rows...) get zero gradients, so
  // optimizers and gradient all-reduce see every parameter.
  void fill_missing_grads();
  const Pi05Config& config() const { return cfg_; }

  PaliGemmaWithExpert paligemma_with_expert{nullptr};
  Linear action_in_proj{nullptr}, action_out_proj{nullptr}, time_mlp_in{nullptr}, time_mlp_out{nullptr};

  // Shortcuts into the tree.
  SiglipVisionTowerImpl& vision_tower() const;
  MultiModalProjectorImpl& projector() const;
  GemmaModelImpl& language_model() const;
  GemmaModelImpl& expert_model() const;

 private:
  struct RecomputeSet {
    bool vision_tower = false;
    std::vector<bool> vision_layer, joint_layer, joint_attention, prefix_mlp, expert_mlp, prefix_gate_up;
  };
  Pi05Config cfg_;
  // The members of every merged GEMM (weights, and SigLIP's biases as groups of their own), in model order.
  std::vector<std::vector<torch::Tensor>> merged_groups() const;
  RecomputeSet recompute_;
  std::vector<std::string> recompute_fqns_;
  std::vector<std::string> fp8_fqns_;
};
TORCH_MODULE(Pi05);

// The batch after ForwardOptions' exact shortcuts (prune_slots, trim_text): empty camera slots dropped, the text
// cut to the longest real prompt rounded up to trim_multiple; the other tensors shared. Decided on the host from
// the batch's used_slots / text_used where set, else from the masks read back (a host sync per shortcut that is
// on); a summary that does not fit the tensors' sizes throws std::invalid_argument. Pi05Impl::forward applies it
// first; a caller that runs the forward without host syncs (a captured CUDA graph) applies it itself and turns
// both options off.
Pi05Batch apply_input_shortcuts(const Pi05Batch& batch, const ForwardOptions& options);

// Sinusoidal time embedding (spec §4.1): periods min_period * (max/min)^(k/(half-1)), sines first. t [B] -> [B, dim],
// computed in t's dtype.
torch::Tensor time_embedding(const torch::Tensor& t, int64_t dim, double min_period = 4e-3, double max_period = 4.0);

// Deterministic random init from `seed` on the parameters' device (spec §9.4 in spirit): Gemma projections and
// heads lecun-normal, heads' biases 0; text embedding normal(0.01); RMS scales 0; SigLIP dense/MHA
// xavier-uniform, MLP biases normal(1e-6), other biases 0, LayerNorms (1, 0), position embedding
// normal(1/sqrt(width)), patch conv lecun-normal. Two deliberate departures so that tests exercise every path:
// the adaRMS dense layers are lecun-normal (openpi: zero, which makes every expert block an identity at init)
// with zero bias, and the projector is lecun-normal (openpi: zero kernel, which would cut the images off).
// Does nothing on the meta device.
void init_weights(Pi05Impl& model, uint64_t seed);

int64_t count_parameters(const torch::nn::Module& module);

}  // namespace vlatune::model
