#include "layout/pi05.h"

#include <algorithm>
#include <map>

#include "formats/fqn_pattern.h"

namespace vlatune::layout {

namespace {

using formats::fqn_within;

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

bool is_index(const std::string& s) {
  return !s.empty() && s.size() < 10 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t at = s.find(sep, start);
    out.push_back(s.substr(start, at == std::string::npos ? std::string::npos : at - start));
    if (at == std::string::npos) return out;
    start = at + 1;
  }
}

// "<prefix><index>[.rest]" -> index and rest (without the dot); false when `fqn` is not of that form.
bool parse_indexed(const std::string& fqn, const std::string& prefix, long& index, std::string& rest) {
  if (!starts_with(fqn, prefix)) return false;
  const size_t dot = fqn.find('.', prefix.size());
  const std::string number =
      fqn.substr(prefix.size(), dot == std::string::npos ? std::string::npos : dot - prefix.size());
  if (!is_index(number)) return false;
  index = std::stol(number);
  rest = dot == std::string::npos ? "" : fqn.substr(dot + 1);
  return true;
}

// A joint layer of either branch: index, rest, and which branch.
bool parse_joint(const std::string& fqn, long& index, std::string& rest, bool& expert) {
  expert = parse_indexed(fqn, kExpertLayerPrefix, index, rest);
  return expert || parse_indexed(fqn, kPrefixLayerPrefix, index, rest);
}

long child_rank(const std::string& name) {
  static const std::map<std::string, long> ranks = {
      {"q_proj", 0},    {"k_proj", 1},      {"v_proj", 2},    {"o_proj", 3},      {"out_proj", 3},
      {"gate_proj", 0}, {"up_proj", 1},     {"down_proj", 2}, {"fc1", 0},         {"fc2", 1},
      {"dense", 0},     {"layer_norm1", 0}, {"self_attn", 1}, {"layer_norm2", 2}, {"mlp", 3}};
  auto it = ranks.find(name);
  return it == ranks.end() ? 9 : it->second;
}

void append_children(std::vector<long>& key, const std::vector<std::string>& segments, size_t from) {
  for (size_t i = from; i < segments.size(); ++i) key.push_back(child_rank(segments[i]));
}

}  // namespace

std::string vision_layer(int64_t i) {
  return kVisionLayerPrefix + std::to_string(i);
}
std::string prefix_layer(int64_t i) {
  return kPrefixLayerPrefix + std::to_string(i);
}
std::string expert_layer(int64_t i) {
  return kExpertLayerPrefix + std::to_string(i);
}

std::string unit_kind(const std::string& fqn) {
  long index = 0;
  std::string rest;
  bool expert = false;
  if (fqn == kVisionTower) return "vision_tower";
  if (parse_indexed(fqn, kVisionLayerPrefix, index, rest) && rest.empty()) return "vit_layer";
  if (parse_joint(fqn, index, rest, expert)) {
    if (rest.empty()) return "decoder_layer";
    if (rest == "self_attn") return "attention";
    if (rest == "mlp") return expert ? "expert_mlp" : "backbone_mlp";
    if (rest == "mlp." + kGateUpLeaf && !expert) return "backbone_mlp_gate_up";
  }
  return "";
}

std::vector<RecomputableUnit> recomputable_units(int64_t vision_depth, int64_t joint_depth) {
  std::vector<RecomputableUnit> out;
  out.push_back({kVisionTower, "vision_tower", 0});
  for (int64_t i = 0; i < vision_depth; ++i) out.push_back({vision_layer(i), "vit_layer", i});
  for (int64_t i = 0; i < joint_depth; ++i) {
    for (const bool expert : {false, true}) {
      const std::string layer = expert ? expert_layer(i) : prefix_layer(i);
      out.push_back({layer, "decoder_layer", i});
      out.push_back({layer + ".self_attn", "attention", i});
      out.push_back({layer + ".mlp", expert ? "expert_mlp" : "backbone_mlp", i});
      // The largest activation of the layer, the cheapest to recompute (one forward GEMM).
      if (!expert) out.push_back({layer + ".mlp." + kGateUpLeaf, "backbone_mlp_gate_up", i});
    }
  }
  return out;
}

std::string joint_twin(const std::string& fqn) {
  long index = 0;
  std::string rest;
  bool expert = false;
  if (!parse_joint(fqn, index, rest, expert) || (!rest.empty() && rest != "self_attn")) return "";
  return (expert ? prefix_layer(index) : expert_layer(index)) + (rest.empty() ? "" : "." + rest);
}

std::string canonical_unit(const std::string& fqn) {
  if (!starts_with(fqn, kExpertLayerPrefix)) return fqn;
  const std::string twin = joint_twin(fqn);
  return twin.empty() ? fqn : twin;
}

std::string merged_gemm_module(const std::string& unit) {
  const size_t dot = unit.rfind('.');
  if (dot == std::string::npos || unit.find('+', dot) == std::string::npos) return "";
  return unit.substr(0, dot);
}

bool unit_covers(const std::string& unit, const std::string& fqn) {
  if (fqn_within(fqn, unit)) return true;
  const std::string module = merged_gemm_module(unit);
  if (!module.empty()) {
    if (!starts_with(fqn, module + ".") || fqn.find('.', module.size() + 1) != std::string::npos) return false;
    const std::vector<std::string> leaves = split(unit.substr(module.size() + 1), '+');
    return std::find(leaves.begin(), leaves.end(), fqn.substr(module.size() + 1)) != leaves.end();
  }
  const std::string twin = joint_twin(unit);
  return !twin.empty() && fqn_within(fqn, twin);
}

bool unit_contains(const std::string& outer, const std::string& inner) {
  return canonical_unit(outer) != canonical_unit(inner) && unit_covers(outer, inner);
}

std::vector<std::pair<std::string, std::vector<std::string>>> recompute_classes(
    const std::vector<std::string>& recomputable) {
  static const std::vector<std::pair<std::string, std::string>> classes = {
      {"vit_layers", "vit_layer"},      {"joint_attention", "attention"},
      {"backbone_mlp", "backbone_mlp"}, {"backbone_mlp_gate_up", "backbone_mlp_gate_up"},
      {"expert_mlp", "expert_mlp"},     {"decoder_layers", "decoder_layer"}};
  std::vector<std::pair<std::string, std::vector<std::string>>> out;
  for (const auto& [name, kind] : classes) {
    std::vector<std::string> fqns;
    for (const std::string& fqn : recomputable)
      if (unit_kind(fqn) == kind && canonical_unit(fqn) == fqn) fqns.push_back(fqn);
    out.emplace_back(name, std::move(fqns));
  }
  return out;
}

std::vector<long> forward_order_key(const std::string& fqn) {
  long index = 0;
  std::string rest;
  bool expert = false;
  if (fqn_within(fqn, kVisionTower)) {
    if (fqn == kVisionTower) return {0};
    if (parse_indexed(fqn, kVisionLayerPrefix, index, rest)) {
      std::vector<long> key = {0, 1, index};
      if (!rest.empty()) append_children(key, split(rest, '.'), 0);
      return key;
    }
    if (fqn_within(fqn, kVisionPostNorm)) return {0, 2};
    return {0, 0};  // embeddings and the encoder container
  }
  if (fqn_within(fqn, kProjector)) return {1, static_cast<long>(split(fqn, '.').size())};
  if (fqn_within(fqn, kEmbedTokens)) return {2, 0};
  if (fqn_within(fqn, kActionInProj)) return {2, 1};
  if (fqn_within(fqn, kTimeMlpIn)) return {2, 2};
  if (fqn_within(fqn, kTimeMlpOut)) return {2, 3};
  if (parse_joint(fqn, index, rest, expert)) {
    if (rest.empty()) return {3, index};
    const std::vector<std::string> segments = split(rest, '.');
    // The joint layer runs: both input norms, the joint attention, the expert's post-attention norm and MLP,
    // then the prefix's (model/gemma.cpp joint_layer).
    long sub = 9;
    if (segments[0] == "input_layernorm") sub = 0;
    if (segments[0] == "self_attn") sub = 1;
    if (segments[0] == "post_attention_layernorm") sub = expert ? 2 : 4;
    if (segments[0] == "mlp") sub = expert ? 3 : 5;
    std::vector<long> key = {3, index, sub, expert ? 1 : 0};
    append_children(key, segments, 1);
    return key;
  }
  if (fqn_within(fqn, kPrefixNorm)) return {4, 0};
  if (fqn_within(fqn, kExpertNorm)) return {4, 1};
  if (fqn_within(fqn, kActionOutProj)) return {4, 2};
  return {5};
}

bool forward_before(const std::string& a, const std::string& b) {
  const auto ka = forward_order_key(a), kb = forward_order_key(b);
  return ka != kb ? ka < kb : a < b;
}

std::vector<GroupPiece> group_pieces(const std::vector<std::string>& module_fqns) {
  // Depth from the module list: the number of joint and encoder layers present.
  long joint_depth = -1, vision_depth = -1;
  for (const std::string& fqn : module_fqns) {
    long index = 0;
    std::string rest;
    bool expert = false;
    if (parse_joint(fqn, index, rest, expert)) joint_depth = std::max(joint_depth, index);
    if (parse_indexed(fqn, kVisionLayerPrefix, index, rest)) vision_depth = std::max(vision_depth, index);
  }
  std::vector<GroupPiece> pieces;
  pieces.push_back({"heads.out", "heads.out", {kExpertNorm, kPrefixNorm, kActionOutProj}});
  for (long i = joint_depth; i >= 0; --i) {
    const std::string name = "layer." + std::to_string(i);
    pieces.push_back({name, name, {prefix_layer(i), expert_layer(i)}});
  }
  pieces.push_back({"heads.in", "heads.in", {kTimeMlpOut, kTimeMlpIn, kActionInProj, kEmbedTokens}});
  pieces.push_back({"vision.head", "vision", {kProjector, kVisionPostNorm}});
  for (long i = vision_depth; i >= 0; --i)
    pieces.push_back({"vision.layer." + std::to_string(i), "vision", {vision_layer(i)}});
  pieces.push_back({"vision.embeddings", "vision", {kVisionEmbeddings}});

  std::vector<GroupPiece> out;
  for (GroupPiece& piece : pieces) {
    std::vector<std::string> roots;
    for (const std::string& root : piece.roots) {
      const bool present = std::any_of(module_fqns.begin(), module_fqns.end(),
                                       [&](const std::string& fqn) { return fqn_within(fqn, root); });
      if (present) roots.push_back(root);
    }
    if (roots.empty()) continue;
    piece.roots = std::move(roots);
    out.push_back(std::move(piece));
  }
  return out;
}

std::vector<std::string> merged_gemm_members(const std::string& linear) {
  long index = 0;
  std::string rest;
  bool expert = false;
  const bool decoder = parse_joint(linear, index, rest, expert);
  const bool vision = parse_indexed(linear, kVisionLayerPrefix, index, rest);
  if (!decoder && !vision) return {linear};
  const std::string parent = linear.substr(0, linear.rfind('.') + 1);
  if (rest == "self_attn.q_proj" || rest == "self_attn.k_proj" || rest == "self_attn.v_proj")
    return {parent + "q_proj", parent + "k_proj", parent + "v_proj"};
  if (decoder && (rest == "mlp.gate_proj" || rest == "mlp.up_proj")) return {parent + "gate_proj", parent + "up_proj"};
  return {linear};
}

bool geglu_down_projection(const std::string& linear) {
  long index = 0;
  std::string rest;
  bool expert = false;
  return parse_joint(linear, index, rest, expert) && rest == "mlp.down_proj";
}

std::string gemm_inventory_name(const std::vector<std::string>& members) {
  if (members.empty()) return "";
  const std::string& first = members[0];
  if (members.size() == 1) return first;
  const std::string parent = first.substr(0, first.rfind('.') + 1);  // "" for a top-level Linear
  for (const std::string& m : members)
    if (m.compare(0, parent.size(), parent) != 0 || m.find('.', parent.size()) != std::string::npos)
      return first + "+" + std::to_string(members.size() - 1) + " more";
  std::string name = parent;
  for (size_t i = 0; i < members.size(); ++i) name += (i ? "+" : "") + members[i].substr(parent.size());
  return name;
}

std::vector<std::string> freeze_preset_modules(formats::FreezePreset preset) {
  if (preset == formats::FreezePreset::kFreezeVisionEncoder) return {kVisionTower};
  return {kPaliGemma};
}

LoraPresetSpec lora_preset(formats::LoraPreset) {
  auto linears = [](const std::string& layer_prefix) {
    std::vector<std::string> out;
    for (const char* leaf : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                             "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"})
      out.push_back(layer_prefix + "*." + leaf);
    return out;
  };
  LoraPresetSpec spec;
  spec.targets.push_back({linears(kPrefixLayerPrefix), 16, 16.0});  // gemma_2b_lora
  spec.targets.push_back({linears(kExpertLayerPrefix), 32, 32.0});  // gemma_300m_lora
  spec.frozen = {kLanguageModel, kExpertModel};
  return spec;
}

std::vector<BackwardFree> backward_free_modules(const std::vector<std::string>& frozen, int64_t joint_depth) {
  auto is_frozen = [&frozen](const std::string& module) { return formats::fqn_within_any(module, frozen); };
  std::vector<BackwardFree> out;
  const bool vision = is_frozen(kVisionTower);
  if (vision) out.push_back({kVisionTower, {}});
  const bool projector = vision && is_frozen(kProjector);
  if (projector) out.push_back({kProjector, {}});
  const bool embed = is_frozen(kEmbedTokens);
  if (embed) out.push_back({kEmbedTokens, {}});
  bool upstream_frozen = projector && embed;  // both inputs of layer 0
  for (int64_t i = 0; i < joint_depth && upstream_frozen; ++i) {
    upstream_frozen = is_frozen(prefix_layer(i));
    if (upstream_frozen) out.push_back({prefix_layer(i), {expert_layer(i), prefix_layer(i) + ".self_attn"}});
  }
  return out;
}

bool row_sparse_gradient(const std::string& param_name) {
  return param_name == kEmbedTokensWeight;
}

}  // namespace vlatune::layout
