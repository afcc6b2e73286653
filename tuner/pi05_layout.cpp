#include "tuner/pi05_layout.h"

#include <algorithm>
#include <map>
#include <set>

#include "formats/fqn_pattern.h"

namespace vlatune::tuner {

namespace {

const std::string kVisionTower = "paligemma_with_expert.paligemma.model.vision_tower";
const std::string kVisionLayers = kVisionTower + ".vision_model.encoder.layers.";
const std::string kProjector = "paligemma_with_expert.paligemma.model.multi_modal_projector";
const std::string kLm = "paligemma_with_expert.paligemma.model.language_model";
const std::string kPrefixLayers = kLm + ".layers.";
const std::string kExpert = "paligemma_with_expert.gemma_expert.model";
const std::string kExpertLayers = kExpert + ".layers.";

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t dot = s.find('.', start);
    out.push_back(s.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (dot == std::string::npos) return out;
    start = dot + 1;
  }
}

std::string join(const std::vector<std::string>& segments) {
  std::string out;
  for (size_t i = 0; i < segments.size(); ++i) out += (i ? "." : "") + segments[i];
  return out;
}

bool is_index(const std::string& s) {
  return !s.empty() && s.size() < 9 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

// "<prefix><index>[.rest]" -> index and rest (without the dot); false when `fqn` is not of that form.
bool parse_indexed(const std::string& fqn, const std::string& prefix, long& index, std::string& rest) {
  if (!starts_with(fqn, prefix)) return false;
  const std::string tail = fqn.substr(prefix.size());
  const size_t dot = tail.find('.');
  const std::string number = tail.substr(0, dot);
  if (!is_index(number)) return false;
  index = std::stol(number);
  rest = dot == std::string::npos ? "" : tail.substr(dot + 1);
  return true;
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

bool fqn_within(const std::string& inner, const std::string& outer) {
  return inner == outer || (inner.size() > outer.size() && starts_with(inner, outer) && inner[outer.size()] == '.');
}

std::vector<long> forward_order_key(const std::string& fqn) {
  long index = 0;
  std::string rest;
  if (fqn_within(fqn, kVisionTower)) {
    if (fqn == kVisionTower) return {0};
    if (parse_indexed(fqn, kVisionLayers, index, rest)) {
      std::vector<long> key = {0, 1, index};
      if (!rest.empty()) append_children(key, split(rest), 0);
      return key;
    }
    if (fqn.find(".post_layernorm") != std::string::npos) return {0, 2};
    return {0, 0};  // embeddings and the encoder container
  }
  if (fqn_within(fqn, kProjector)) return {1, static_cast<long>(split(fqn).size())};
  if (fqn_within(fqn, kLm + ".embed_tokens")) return {2, 0};
  if (fqn_within(fqn, "action_in_proj")) return {2, 1};
  if (fqn_within(fqn, "time_mlp_in")) return {2, 2};
  if (fqn_within(fqn, "time_mlp_out")) return {2, 3};
  for (const std::string* prefix : {&kPrefixLayers, &kExpertLayers}) {
    if (!parse_indexed(fqn, *prefix, index, rest)) continue;
    const bool expert = prefix == &kExpertLayers;
    if (rest.empty()) return {3, index};
    const std::vector<std::string> segments = split(rest);
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
  if (fqn_within(fqn, kLm + ".norm")) return {4, 0};
  if (fqn_within(fqn, kExpert + ".norm")) return {4, 1};
  if (fqn_within(fqn, "action_out_proj")) return {4, 2};
  return {5};
}

bool forward_before(const std::string& a, const std::string& b) {
  const auto ka = forward_order_key(a), kb = forward_order_key(b);
  return ka != kb ? ka < kb : a < b;
}

UnitSpec unit_for_fqn(const std::string& fqn, const std::string& kind) {
  long index = 0;
  std::string rest;
  if ((parse_indexed(fqn, kPrefixLayers, index, rest) || parse_indexed(fqn, kExpertLayers, index, rest)) &&
      (rest.empty() || rest == "self_attn")) {
    // The joint layer and the joint attention block are one unit for both branches; named by the backbone's.
    const std::string suffix = rest.empty() ? "" : "." + rest;
    return {{kPrefixLayers + std::to_string(index) + suffix, kExpertLayers + std::to_string(index) + suffix}, kind};
  }
  return {{fqn}, kind};
}

std::string unit_kind(const std::string& fqn) {
  long index = 0;
  std::string rest;
  if (fqn == kVisionTower) return "vision_tower";
  if (parse_indexed(fqn, kVisionLayers, index, rest) && rest.empty()) return "vit_layer";
  if (parse_indexed(fqn, kPrefixLayers, index, rest) || parse_indexed(fqn, kExpertLayers, index, rest)) {
    const bool expert = starts_with(fqn, kExpertLayers);
    if (rest.empty()) return "decoder_layer";
    if (rest == "self_attn") return "attention";
    if (rest == "mlp") return expert ? "expert_mlp" : "backbone_mlp";
    if (rest == "mlp.gate_proj+up_proj" && !expert) return "backbone_mlp_gate_up";
  }
  return "";
}

bool unit_covers(const std::string& unit, const std::string& fqn) {
  if (fqn_within(fqn, unit)) return true;
  const size_t dot = unit.rfind('.');
  if (dot == std::string::npos || unit.find('+', dot) == std::string::npos) return false;
  const std::string parent = unit.substr(0, dot);
  if (!starts_with(fqn, parent + ".") || fqn.find('.', dot + 1) != std::string::npos) return false;
  const std::string leaf = fqn.substr(dot + 1), leaves = unit.substr(dot + 1);
  size_t start = 0;
  while (start <= leaves.size()) {
    const size_t plus = std::min(leaves.find('+', start), leaves.size());
    if (leaves.substr(start, plus - start) == leaf) return true;
    start = plus + 1;
  }
  return false;
}

std::vector<UnitSpec> default_recompute_units(const std::vector<std::string>& recomputable,
                                              const std::vector<std::string>& module_fqns) {
  std::vector<UnitSpec> out;
  std::set<std::string> seen;
  for (const std::string& fqn : recomputable.empty() ? module_fqns : recomputable) {
    std::string kind = unit_kind(fqn);
    if (kind.empty() && recomputable.empty()) continue;
    if (kind.empty()) kind = "recomputable";
    UnitSpec unit = unit_for_fqn(fqn, kind);
    if (!seen.insert(unit.aliases[0]).second) continue;
    out.push_back(std::move(unit));
  }
  std::sort(out.begin(), out.end(),
            [](const UnitSpec& a, const UnitSpec& b) { return forward_before(a.aliases[0], b.aliases[0]); });
  return out;
}

std::vector<GroupPiece> group_pieces(const std::vector<std::string>& module_fqns) {
  // Depth from the profile rows: the number of joint and encoder layers present.
  long joint_depth = -1, vision_depth = -1;
  for (const std::string& fqn : module_fqns) {
    long index = 0;
    std::string rest;
    if (parse_indexed(fqn, kPrefixLayers, index, rest) || parse_indexed(fqn, kExpertLayers, index, rest))
      joint_depth = std::max(joint_depth, index);
    if (parse_indexed(fqn, kVisionLayers, index, rest)) vision_depth = std::max(vision_depth, index);
  }
  std::vector<GroupPiece> pieces;
  pieces.push_back({"heads.out", "heads.out", {kExpert + ".norm", kLm + ".norm", "action_out_proj"}});
  for (long i = joint_depth; i >= 0; --i) {
    const std::string name = "layer." + std::to_string(i);
    pieces.push_back({name, name, {kPrefixLayers + std::to_string(i), kExpertLayers + std::to_string(i)}});
  }
  pieces.push_back({"heads.in", "heads.in", {"time_mlp_out", "time_mlp_in", "action_in_proj", kLm + ".embed_tokens"}});
  pieces.push_back({"vision.head", "vision", {kProjector, kVisionTower + ".vision_model.post_layernorm"}});
  for (long i = vision_depth; i >= 0; --i)
    pieces.push_back({"vision.layer." + std::to_string(i), "vision", {kVisionLayers + std::to_string(i)}});
  pieces.push_back({"vision.embeddings", "vision", {kVisionTower + ".vision_model.embeddings"}});

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

const std::vector<std::string>& default_fp8_exclusions() {
  // The seed's precision-sensitive set (anchors §4.6: measured thresholds decide the rest). Thin GEMMs here are
  // also the ones FP8 cannot speed up: M = batch for the time MLP and adaRMS, N = 32 for the action head.
  static const std::vector<std::string> patterns = {
      kVisionTower,  // SigLIP: image features feed every prefix token
      kProjector,
      "action_in_proj",
      "action_out_proj",
      "time_mlp_in",
      "time_mlp_out",
      kExpertLayers + "*.input_layernorm.dense",  // adaRMS modulation (scale, shift, gate)
      kExpertLayers + "*.post_attention_layernorm.dense",
      kExpert + ".norm.dense",
  };
  return patterns;
}

bool pattern_covers(const std::string& pattern, const std::string& fqn) {
  const std::vector<std::string> segments = split(fqn);
  for (size_t n = segments.size(); n >= 1; --n) {
    const std::vector<std::string> prefix(segments.begin(), segments.begin() + static_cast<long>(n));
    if (formats::fqn_matches(pattern, join(prefix))) return true;
  }
  return false;
}

std::vector<std::string> compact_patterns(const std::vector<std::string>& chosen,
                                          const std::vector<std::string>& universe) {
  const std::set<std::string> chosen_set(chosen.begin(), chosen.end());
  std::set<std::string> covered, out;
  for (const std::string& fqn : chosen_set) {
    if (covered.count(fqn)) continue;
    const std::vector<std::string> segments = split(fqn);
    bool done = false;
    for (size_t p = 0; p < segments.size() && !done; ++p) {
      if (!is_index(segments[p])) continue;
      std::vector<std::string> pattern_segments = segments;
      pattern_segments[p] = "*";
      const std::string pattern = join(pattern_segments);
      std::vector<std::string> matched;
      bool complete = true;
      for (const std::string& other : universe) {
        if (!formats::fqn_matches(pattern, other)) continue;
        if (!chosen_set.count(other)) complete = false;
        matched.push_back(other);
      }
      if (complete && matched.size() > 1) {
        out.insert(pattern);
        covered.insert(matched.begin(), matched.end());
        done = true;
      }
    }
    if (!done) {
      out.insert(fqn);
      covered.insert(fqn);
    }
  }
  return {out.begin(), out.end()};
}

}  // namespace vlatune::tuner
