// Pi0.5's module tree as every part of vlatune needs to know it, in one torch-free place: the openpi FQNs, the
// recompute units and which of them contain which, the two names of a joint unit, the named gradient groups and
// their backward order, the names of merged GEMMs, and the parameter whose gradient is row-sparse. The model
// builds these modules (model/pi05.h); the profiler, the tuner and the trainer only read this file.
//
// Recompute units: the vision tower; a SigLIP encoder layer; a joint decoder layer (`...language_model.layers.i`
// and `...gemma_expert.model.layers.i` name the same unit: the two branches run as one); a joint attention block
// (`...layers.i.self_attn` of either branch, also one unit); each branch's MLP; each backbone MLP's merged gate+up
// GEMM output (`...language_model.layers.i.mlp.gate_proj+up_proj`, named as the GEMM inventory names the merged
// GEMM: not a module). A joint unit's canonical name is the backbone's.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "formats/recipe.h"

namespace vlatune::layout {

// ---- FQNs (openpi PyTorch state-dict names) ----
inline const std::string kVisionTower = "paligemma_with_expert.paligemma.model.vision_tower";
inline const std::string kVisionEmbeddings = kVisionTower + ".vision_model.embeddings";
inline const std::string kVisionLayerPrefix = kVisionTower + ".vision_model.encoder.layers.";  // + index
inline const std::string kVisionPostNorm = kVisionTower + ".vision_model.post_layernorm";
inline const std::string kPaliGemma = "paligemma_with_expert.paligemma";
inline const std::string kProjector = "paligemma_with_expert.paligemma.model.multi_modal_projector";
inline const std::string kLanguageModel = "paligemma_with_expert.paligemma.model.language_model";
inline const std::string kEmbedTokens = kLanguageModel + ".embed_tokens";
inline const std::string kPrefixLayerPrefix = kLanguageModel + ".layers.";  // + index
inline const std::string kPrefixNorm = kLanguageModel + ".norm";
inline const std::string kExpertModel = "paligemma_with_expert.gemma_expert.model";
inline const std::string kExpertLayerPrefix = kExpertModel + ".layers.";  // + index
inline const std::string kExpertNorm = kExpertModel + ".norm";
inline const std::string kActionInProj = "action_in_proj";
inline const std::string kActionOutProj = "action_out_proj";
inline const std::string kTimeMlpIn = "time_mlp_in";
inline const std::string kTimeMlpOut = "time_mlp_out";
// The leaf of the backbone MLP's merged gate+up output unit: `<mlp>.gate_proj+up_proj`.
inline const std::string kGateUpLeaf = "gate_proj+up_proj";

std::string vision_layer(int64_t i);  // kVisionLayerPrefix + i
std::string prefix_layer(int64_t i);  // kPrefixLayerPrefix + i
std::string expert_layer(int64_t i);  // kExpertLayerPrefix + i

// ---- Recompute units ----
// The kind of a recompute unit named `fqn`: "vision_tower", "vit_layer", "decoder_layer" (either branch's name),
// "attention" (either branch's self_attn), "backbone_mlp", "expert_mlp", "backbone_mlp_gate_up"; "" for others.
std::string unit_kind(const std::string& fqn);

struct RecomputableUnit {
  std::string fqn;    // one name of it (joint units are listed under both names, backbone first)
  std::string kind;   // unit_kind(fqn)
  int64_t index = 0;  // the layer index (0 for the vision tower)
};
// Every name a recompute selection may use, in model order: the vision tower, its encoder layers, then per joint
// layer i, for the backbone and then the expert: the layer, its self_attn, its mlp, and after the backbone's mlp
// its merged gate+up output.
std::vector<RecomputableUnit> recomputable_units(int64_t vision_depth, int64_t joint_depth);

// The other branch's name of a joint layer or joint attention unit (backbone <-> expert); "" for any other FQN.
std::string joint_twin(const std::string& fqn);
// The backbone's name of a joint unit named by the expert; any other FQN unchanged.
std::string canonical_unit(const std::string& fqn);

// For a merged-GEMM output unit `<module>.<leaf>+<leaf>...`: the module whose scope runs the GEMM; "" otherwise.
std::string merged_gemm_module(const std::string& unit);

// True when recomputing the unit `unit` re-runs `fqn`: `fqn` lies inside `unit` or inside its joint twin, or
// `unit` names a merged GEMM's output of which `fqn` is a member (`<module>.<leaf>`).
bool unit_covers(const std::string& unit, const std::string& fqn);
// True when selecting `outer` already recomputes everything the distinct unit `inner` covers (the nesting the
// model refuses). The two names of one joint unit do not contain each other.
bool unit_contains(const std::string& outer, const std::string& inner);

// The recompute A/B classes of profile.json, named after the units they hold: "vit_layers", "joint_attention",
// "backbone_mlp", "backbone_mlp_gate_up", "expert_mlp", "decoder_layers", each listing the canonical names of
// `recomputable` of that kind, in the given order. Joint attention covers both branches (one attention over
// prefix and suffix), so there is no separate "expert attention" class.
std::vector<std::pair<std::string, std::vector<std::string>>> recompute_classes(
    const std::vector<std::string>& recomputable);

// ---- Forward order and named groups ----
// A sort key following the forward pass: vision tower (embeddings, encoder layers by index, post norm),
// projector, input heads, joint layers by index (norms, attention, expert MLP, prefix MLP), output heads,
// anything else. Parents sort before their children.
std::vector<long> forward_order_key(const std::string& fqn);
bool forward_before(const std::string& a, const std::string& b);

// A piece of a gradient group, finest first: the named units of the recipe (`vision`, `layer.i`, `heads.in`,
// `heads.out`) with the vision tower split into its encoder layers (so its gradients can be reduced while the
// rest of the tower's backward runs).
struct GroupPiece {
  std::string name;                // "heads.out", "layer.17", ..., "vision.layer.0", "vision.embeddings"
  std::string unit;                // the named unit it belongs to: "heads.out", "layer.17", "vision", "heads.in"
  std::vector<std::string> roots;  // module FQNs whose parameters it holds
};
// The pieces in backward order (the order their gradients become ready), restricted to modules present in
// `module_fqns` (a root without an entry is kept when some entry lies inside it).
std::vector<GroupPiece> group_pieces(const std::vector<std::string>& module_fqns);

// ---- Merged GEMMs ----
// The Linears that run as one GEMM with `linear` on the fused path, in output-column order: a decoder layer's
// q/k/v, its gate/up, a SigLIP layer's q/k/v; `linear` alone otherwise.
std::vector<std::string> merged_gemm_members(const std::string& linear);
// The GEMM inventory's name of a GEMM run by `members` (Linear FQNs in output-column order): the FQN of a single
// Linear; "parent.q_proj+k_proj+v_proj" for members of one parent module; "first+N more" for members of several.
std::string gemm_inventory_name(const std::vector<std::string>& members);
// True for a decoder layer's MLP down projection (either branch): the Linear whose input is geglu(gate+up).
bool geglu_down_projection(const std::string& linear);
// ---- Freezing and LoRA presets (recipe `freeze.presets`, `lora.preset`) ----
// The modules a freezing preset freezes, as LeRobot's Pi0.5 options: freeze_vision_encoder -> the SigLIP vision
// tower; train_expert_only -> all of PaliGemma (vision tower, projector, language model), so the action expert and
// the action/time projections train.
std::vector<std::string> freeze_preset_modules(formats::FreezePreset preset);

struct LoraPresetTarget {
  std::vector<std::string> modules;  // FQN patterns of Linears
  int rank = 0;
  double alpha = 0;
};
struct LoraPresetSpec {
  std::vector<LoraPresetTarget> targets;
  std::vector<std::string> frozen;  // modules whose own parameters the preset freezes (adapters train)
};
// openpi: gemma_2b_lora (rank 16, alpha 16) on the language model's attention (q, k, v, o) and MLP (gate, up, down)
// Linears, gemma_300m_lora (rank 32, alpha 32) on the action expert's, and its freeze filter (every parameter of
// both Gemma towers but the adapters: embeddings, norms, adaRMS modulations too). The vision tower, the projector
// and the action/time projections stay trainable.
LoraPresetSpec lora_preset(formats::LoraPreset preset);

// ---- Where the backward runs under freezing ----
// Pi0.5's data flow ahead of the action expert: vision tower -> projector -> language-model layer 0, the token
// embedding -> layer 0, layer i -> layer i + 1 (the prefix); the expert reads every prefix layer's K/V, and the loss
// is on the expert's output, so the expert and the action/time projections always run their backward. A module
// runs none when it and everything upstream of it are frozen: nothing it computes needs a gradient.
struct BackwardFree {
  std::string root;  // a module whose own backward does not run
  // What still runs backward inside its scope at run time: a prefix layer's scope encloses the joint layer, so the
  // expert's layer i, and the joint attention (the expert's queries attend over the prefix's keys and values).
  std::vector<std::string> kept;
};
// The modules that run no backward once `frozen` (module FQNs frozen whole, resolved) is frozen, in forward order,
// for a model of `joint_depth` joint layers. A module counts as frozen when it lies inside one of `frozen`.
std::vector<BackwardFree> backward_free_modules(const std::vector<std::string>& frozen, int64_t joint_depth);

// A LoRA'd Linear's adapter parameters: `<linear>.lora_A` [rank, in] and `<linear>.lora_B` [out, rank].
inline const std::string kLoraA = "lora_A";
inline const std::string kLoraB = "lora_B";

// ---- Gradients ----
// The token embedding's weight: its gradient comes from the lookup alone (the LM head is unused), so it is
// non-zero only in the rows of the tokens seen (trainer/grad_buckets.h reduces those rows alone).
inline const std::string kEmbedTokensWeight = kEmbedTokens + ".weight";
bool row_sparse_gradient(const std::string& param_name);

}  // namespace vlatune::layout
