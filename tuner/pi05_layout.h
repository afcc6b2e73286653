// What the tuner knows about Pi0.5's module tree, in one place: which modules can be recomputed and as which
// unit, the order modules run in the forward pass, the named groups of DESIGN.md, and the Linears kept in bf16
// by default. Everything else in tuner/ works on FQNs and numbers only.
//
// Recompute units (model/pi05.h Pi05Impl::set_recompute): a SigLIP encoder layer; a joint decoder layer
// (`...language_model.layers.i` and `...gemma_expert.model.layers.i` name the same unit: the two branches run as
// one); a joint attention block (`...layers.i.self_attn` of either branch, also one unit); each branch's MLP;
// each backbone MLP's merged gate+up GEMM output (`...language_model.layers.i.mlp.gate_proj+up_proj`, named as the
// GEMM inventory names the merged GEMM: not a module, so it has no profile row; its cost comes from that GEMM).
// A unit's cost is the sum of the profile rows of all its names (aliases); the recipe names it by its first.
#pragma once

#include <string>
#include <vector>

namespace vlatune::tuner {

// A candidate recompute unit before it meets the numbers.
struct UnitSpec {
  std::vector<std::string> aliases;  // FQNs that select it; aliases[0] is the name the recipe uses
  std::string kind;                  // "vit_layer", "decoder_layer", "attention", "backbone_mlp", "expert_mlp",
                                     // "backbone_mlp_gate_up", "vision_tower" or "custom"
};

// The default candidates: the profile's `recomputable` list (what the trainer can recompute) when it has one,
// else those present among `module_fqns` (the profile's rows): SigLIP encoder layers, and per joint layer i the
// layer, its attention and each branch's MLP. Sorted in forward order.
std::vector<UnitSpec> default_recompute_units(const std::vector<std::string>& recomputable,
                                              const std::vector<std::string>& module_fqns);

// "vit_layer", "vision_tower", "decoder_layer", "attention", "backbone_mlp", "expert_mlp",
// "backbone_mlp_gate_up", or "" for others.
std::string unit_kind(const std::string& fqn);

// True when recomputing the unit named `unit` re-runs `fqn`: `fqn` lies inside it, or `unit` names a merged GEMM
// (`<module>.<leaf>+<leaf>...`) of which `fqn` is a member (`<module>.<leaf>`).
bool unit_covers(const std::string& unit, const std::string& fqn);

// The unit an FQN selects: its joint sibling is added for decoder layers and attention blocks.
UnitSpec unit_for_fqn(const std::string& fqn, const std::string& kind);

// A sort key following the forward pass: vision tower (embeddings, encoder layers by index, post norm),
// projector, input heads, joint layers by index (norm, attention, expert MLP, prefix MLP), output heads,
// anything else. Parents sort before their children.
std::vector<long> forward_order_key(const std::string& fqn);
bool forward_before(const std::string& a, const std::string& b);

// True when `inner` is `outer` or lies inside it (segment-wise prefix).
bool fqn_within(const std::string& inner, const std::string& outer);

// A piece of a communication group, finest first: named units (DESIGN.md) with the vision tower split into its
// encoder layers (so that its gradients can be reduced while the rest of the tower's backward runs).
struct GroupPiece {
  std::string name;                // "heads.out", "layer.17", ..., "vision.layer.0", "vision.rest"
  std::string unit;                // the named unit it belongs to: "heads.out", "layer.17", "vision", "heads.in"
  std::vector<std::string> roots;  // module FQNs (recipe patterns) whose parameters it holds
};
// The pieces in backward order (the order their gradients become ready), restricted to modules present in
// `module_fqns` (a root without a row is kept when some row lies inside it).
std::vector<GroupPiece> group_pieces(const std::vector<std::string>& module_fqns);

// Linears kept in bf16 unless --fp8-include names them: the precision-sensitive set of the seed (vision tower,
// projector, action and time projections, adaRMS dense layers). Patterns exclude the modules they match and
// everything inside them.
const std::vector<std::string>& default_fp8_exclusions();

// True when `pattern` (recipe syntax) matches `fqn` or one of its ancestors.
bool pattern_covers(const std::string& pattern, const std::string& fqn);

// The shortest pattern list that selects exactly `chosen` among `universe`: where every FQN that differs from a
// chosen one only in a numeric segment is chosen too, that segment becomes `*`; otherwise the FQN is listed.
// The result is sorted; resolving it against `universe` gives `chosen` back (the tests check this).
std::vector<std::string> compact_patterns(const std::vector<std::string>& chosen,
                                          const std::vector<std::string>& universe);

}  // namespace vlatune::tuner
