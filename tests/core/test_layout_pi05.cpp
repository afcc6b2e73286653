// layout/pi05: Pi0.5's module tree as the profiler, tuner, trainer and model read it: the two names of a joint
// unit, which recompute unit contains which (the nesting the model refuses), the A/B classes, the gradient groups
// in backward order, merged GEMMs and their inventory names, the row-sparse embedding.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "layout/pi05.h"

using namespace vlatune::layout;

namespace {

const std::string kPL = kPrefixLayerPrefix;
const std::string kEL = kExpertLayerPrefix;

std::string gate_up(int i) {
  return kPL + std::to_string(i) + ".mlp." + kGateUpLeaf;
}

std::vector<std::string> names_of(const std::vector<RecomputableUnit>& units) {
  std::vector<std::string> out;
  for (const auto& u : units) out.push_back(u.fqn);
  return out;
}

}  // namespace

TEST_CASE("A joint layer and its attention have two names; the backbone's is canonical", "[layout]") {
  CHECK(joint_twin(kPL + "3") == kEL + "3");
  CHECK(joint_twin(kEL + "3.self_attn") == kPL + "3.self_attn");
  CHECK(joint_twin(kPL + "3.mlp").empty());
  CHECK(joint_twin(kVisionTower).empty());
  CHECK(canonical_unit(kEL + "3") == kPL + "3");
  CHECK(canonical_unit(kEL + "3.mlp") == kEL + "3.mlp");
  CHECK(canonical_unit(kPL + "3.self_attn") == kPL + "3.self_attn");
}

TEST_CASE("A unit covers what lies inside it or its twin, and a merged GEMM's members", "[layout]") {
  CHECK(unit_covers(kEL + "3", kPL + "3.mlp.down_proj"));  // either name of joint layer 3 runs both branches
  CHECK(unit_covers(kPL + "3.self_attn", kEL + "3.self_attn.q_proj"));
  CHECK_FALSE(unit_covers(kPL + "3.mlp", kEL + "3.mlp.up_proj"));  // MLPs are per branch
  CHECK(unit_covers(gate_up(3), kPL + "3.mlp.gate_proj"));
  CHECK_FALSE(unit_covers(gate_up(3), kPL + "3.mlp.down_proj"));
  CHECK(merged_gemm_module(gate_up(3)) == kPL + "3.mlp");
  CHECK(merged_gemm_module(kPL + "3.mlp").empty());
}

TEST_CASE("Recompute units nest as the model runs them; a joint unit's two names do not nest", "[layout]") {
  CHECK(unit_contains(kVisionTower, vision_layer(1)));
  CHECK(unit_contains(kEL + "2", kPL + "2.self_attn"));
  CHECK(unit_contains(kPL + "2", kEL + "2.mlp"));
  CHECK(unit_contains(kEL + "2", gate_up(2)));
  CHECK(unit_contains(kPL + "2.mlp", gate_up(2)));
  CHECK_FALSE(unit_contains(kPL + "2", kEL + "2"));
  CHECK_FALSE(unit_contains(kPL + "2.self_attn", kEL + "2.self_attn"));
  CHECK_FALSE(unit_contains(gate_up(2), kPL + "2.mlp"));
  CHECK_FALSE(unit_contains(kPL + "2", kPL + "3.mlp"));
  CHECK_FALSE(unit_contains(kEL + "2.mlp", gate_up(2)));
}

TEST_CASE("The recomputable units are listed in model order with their kinds", "[layout]") {
  const auto units = recomputable_units(2, 2);
  CHECK(names_of(units) == std::vector<std::string>{kVisionTower, vision_layer(0), vision_layer(1), kPL + "0",
                                                    kPL + "0.self_attn", kPL + "0.mlp", gate_up(0), kEL + "0",
                                                    kEL + "0.self_attn", kEL + "0.mlp", kPL + "1", kPL + "1.self_attn",
                                                    kPL + "1.mlp", gate_up(1), kEL + "1", kEL + "1.self_attn",
                                                    kEL + "1.mlp"});
  for (const auto& u : units) {
    INFO(u.fqn);
    CHECK(unit_kind(u.fqn) == u.kind);
  }
  CHECK(units[5].index == 0);
  CHECK(units[12].index == 1);
}

TEST_CASE("The A/B classes hold the canonical names of each kind", "[layout]") {
  std::map<std::string, std::vector<std::string>> classes;
  for (const auto& [name, fqns] : recompute_classes(names_of(recomputable_units(1, 2)))) classes[name] = fqns;
  CHECK(classes.size() == 6);
  CHECK(classes.at("vit_layers") == std::vector<std::string>{vision_layer(0)});
  CHECK(classes.at("decoder_layers") == std::vector<std::string>{kPL + "0", kPL + "1"});
  CHECK(classes.at("joint_attention") == std::vector<std::string>{kPL + "0.self_attn", kPL + "1.self_attn"});
  CHECK(classes.at("expert_mlp") == std::vector<std::string>{kEL + "0.mlp", kEL + "1.mlp"});
  CHECK(classes.at("backbone_mlp_gate_up") == std::vector<std::string>{gate_up(0), gate_up(1)});
}

TEST_CASE("Forward order: vision, projector, input heads, joint layers, output heads", "[layout]") {
  std::vector<std::string> fqns = {kActionOutProj, kEL + "0.mlp", kPL + "0.mlp",   kPL + "1",           kProjector,
                                   kActionInProj,  kVisionTower,  vision_layer(1), kPL + "0.self_attn", kExpertNorm};
  std::sort(fqns.begin(), fqns.end(), forward_before);
  CHECK(fqns == std::vector<std::string>{kVisionTower, vision_layer(1), kProjector, kActionInProj, kPL + "0.self_attn",
                                         kEL + "0.mlp", kPL + "0.mlp", kPL + "1", kExpertNorm, kActionOutProj});
}

TEST_CASE("Group pieces come in backward order and skip what the model does not have", "[layout]") {
  const std::vector<std::string> fqns = {kPL + "0",       kEL + "0",     kPL + "1.mlp",
                                         vision_layer(0), kActionInProj, kActionOutProj};
  std::vector<std::string> names;
  for (const auto& p : group_pieces(fqns)) names.push_back(p.name);
  CHECK(names == std::vector<std::string>{"heads.out", "layer.1", "layer.0", "heads.in", "vision.layer.0"});
  CHECK(group_pieces(fqns)[1].roots == std::vector<std::string>{kPL + "1"});
}

TEST_CASE("Merged GEMMs: q/k/v and gate/up run as one, and the inventory names them", "[layout]") {
  CHECK(merged_gemm_members(kEL + "4.self_attn.k_proj") ==
        std::vector<std::string>{kEL + "4.self_attn.q_proj", kEL + "4.self_attn.k_proj", kEL + "4.self_attn.v_proj"});
  CHECK(merged_gemm_members(kPL + "4.mlp.up_proj") ==
        std::vector<std::string>{kPL + "4.mlp.gate_proj", kPL + "4.mlp.up_proj"});
  CHECK(merged_gemm_members(vision_layer(2) + ".self_attn.q_proj").size() == 3);
  CHECK(merged_gemm_members(vision_layer(2) + ".mlp.fc1") == std::vector<std::string>{vision_layer(2) + ".mlp.fc1"});
  CHECK(merged_gemm_members(kPL + "4.mlp.down_proj") == std::vector<std::string>{kPL + "4.mlp.down_proj"});
  CHECK(gemm_inventory_name(merged_gemm_members(kPL + "4.mlp.up_proj")) == gate_up(4));
}

TEST_CASE("GEMM inventory names: one Linear, members of one module, members of several", "[layout]") {
  CHECK(gemm_inventory_name({"a.b.q_proj"}) == "a.b.q_proj");
  CHECK(gemm_inventory_name({"a.b.q_proj", "a.b.k_proj", "a.b.v_proj"}) == "a.b.q_proj+k_proj+v_proj");
  CHECK(gemm_inventory_name({"x", "y"}) == "x+y");
  // Linears of different modules (nested parents differ).
  CHECK(gemm_inventory_name({"m.layers.0.input_layernorm.dense", "m.layers.0.post_attention_layernorm.dense",
                             "m.norm.dense"}) == "m.layers.0.input_layernorm.dense+2 more");
  CHECK(gemm_inventory_name({"a.b.q_proj", "a.b.c.k_proj"}) == "a.b.q_proj+1 more");
  CHECK(gemm_inventory_name({}).empty());
}

TEST_CASE("Only the token embedding has a row-sparse gradient", "[layout]") {
  CHECK(row_sparse_gradient(kEmbedTokens + ".weight"));
  CHECK_FALSE(row_sparse_gradient(kPL + "0.mlp.up_proj.weight"));
  CHECK_FALSE(row_sparse_gradient(kEmbedTokens));
}

TEST_CASE("The freezing and LoRA presets name LeRobot's and openpi's module sets", "[layout][lora]") {
  using vlatune::formats::FreezePreset;
  CHECK(freeze_preset_modules(FreezePreset::kFreezeVisionEncoder) ==
        std::vector<std::string>{"paligemma_with_expert.paligemma.model.vision_tower"});
  CHECK(freeze_preset_modules(FreezePreset::kTrainExpertOnly) ==
        std::vector<std::string>{"paligemma_with_expert.paligemma"});
  const LoraPresetSpec openpi = lora_preset(vlatune::formats::LoraPreset::kOpenpi);
  REQUIRE(openpi.targets.size() == 2);
  CHECK(openpi.targets[0].rank == 16);  // gemma_2b_lora
  CHECK(openpi.targets[0].alpha == 16.0);
  CHECK(openpi.targets[1].rank == 32);  // gemma_300m_lora
  CHECK(openpi.targets[1].alpha == 32.0);
  for (const auto& t : openpi.targets) CHECK(t.modules.size() == 7);
  CHECK(openpi.targets[0].modules.front() == kPrefixLayerPrefix + "*.self_attn.q_proj");
  CHECK(openpi.targets[1].modules.back() == kExpertLayerPrefix + "*.mlp.down_proj");
  CHECK(openpi.frozen == std::vector<std::string>{kLanguageModel, kExpertModel});
}

TEST_CASE("A frozen module runs no backward only when everything upstream of it is frozen too", "[layout][freeze]") {
  auto roots = [](const std::vector<BackwardFree>& free) {
    std::vector<std::string> out;
    for (const auto& f : free) out.push_back(f.root);
    return out;
  };
  // The vision tower has nothing upstream: freezing it removes its whole backward, and nothing else's.
  const auto vision =
      backward_free_modules(freeze_preset_modules(vlatune::formats::FreezePreset::kFreezeVisionEncoder), 3);
  CHECK(roots(vision) == std::vector<std::string>{kVisionTower});
  CHECK(vision[0].kept.empty());

  // All of PaliGemma: the tower, the projector, the embedding and every prefix layer; each layer keeps the expert's
  // layer and the joint attention that run inside its scope.
  const auto paligemma =
      backward_free_modules(freeze_preset_modules(vlatune::formats::FreezePreset::kTrainExpertOnly), 3);
  CHECK(roots(paligemma) == std::vector<std::string>{kVisionTower, kProjector, kEmbedTokens, prefix_layer(0),
                                                     prefix_layer(1), prefix_layer(2)});
  CHECK(paligemma[3].kept == std::vector<std::string>{expert_layer(0), prefix_layer(0) + ".self_attn"});

  // A trainable projector feeds layer 0: the frozen language model still runs its backward, the embedding does not.
  CHECK(roots(backward_free_modules({kVisionTower, kLanguageModel}, 3)) ==
        std::vector<std::string>{kVisionTower, kEmbedTokens});
  // A trainable layer 1 stops the chain there: layer 2 passes gradients back to it.
  CHECK(roots(backward_free_modules({kVisionTower, kProjector, kEmbedTokens, prefix_layer(0), prefix_layer(2)}, 3)) ==
        std::vector<std::string>{kVisionTower, kProjector, kEmbedTokens, prefix_layer(0)});
  // The projector alone frozen runs backward: the vision tower upstream of it trains.
  CHECK(roots(backward_free_modules({kProjector}, 3)).empty());
  // A part of a layer frozen is not the layer frozen.
  CHECK(roots(backward_free_modules(
            {kPaliGemma + ".model.vision_tower", kProjector, kEmbedTokens, prefix_layer(0) + ".mlp"}, 3)) ==
        std::vector<std::string>{kVisionTower, kProjector, kEmbedTokens});
}
