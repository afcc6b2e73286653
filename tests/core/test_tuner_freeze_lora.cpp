// --allow freeze and --allow lora: the planner prices freezing and LoRA from the profile alone (gradients, moments,
// adapters, the backward that no longer runs, its activations), takes them only when allowed and says so first.
// The expected numbers are computed here from the fixture's JSON, not through the tuner's row helpers.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "formats/fqn_pattern.h"
#include "formats/json_io.h"
#include "formats/profile.h"
#include "formats/recipe.h"
#include "layout/pi05.h"
#include "profile_fixtures.h"
#include "tuner/cost_model.h"
#include "tuner/planner.h"
#include "tuner/trainable_change.h"

using namespace vlatune;
using namespace vlatune::tuner;
using vlatune::test::h200_profile;
using vlatune::test::kH200Profile;

namespace {

const nlohmann::json& h200_json() {
  static const nlohmann::json j = formats::read_json_file(kH200Profile);
  return j;
}

// A module row's field at batches[i], straight from the JSON.
double row(size_t batch, const std::string& fqn, const char* field) {
  for (const auto& m : h200_json()["batches"][batch]["modules"])
    if (m["fqn"] == fqn) return m[field].get<double>();
  FAIL("no row " << fqn);
  return 0;
}

std::string plan_error(const PlanOptions& o) {
  try {
    plan(h200_profile(), kH200Profile, o);
  } catch (const PlanInputError& e) {
    return e.what();
  }
  return "";
}

CostModel priced(const formats::Recipe::Freeze& freeze, const formats::Recipe::Lora& lora = {}) {
  CostModel m = build_cost_model(h200_profile(), kH200Profile);
  plan_trainable(m, resolve_trainable(h200_profile(), freeze, lora, "test"), formats::StateDtype::kAuto, 1, "test");
  return m;
}

formats::Recipe::Freeze preset(formats::FreezePreset p) {
  formats::Recipe::Freeze f;
  f.presets = {p};
  return f;
}

}  // namespace

TEST_CASE("--allow freeze fits a budget full training cannot meet, freezing the least that fits, and says so first",
          "[tuner][plan][freeze]") {
  PlanOptions o;
  o.global_batch = 32;
  o.memory_budget_gib = 20;
  const std::string e = plan_error(o);
  CHECK(e.find("--allow freeze would make it fit (freeze train_expert_only)") != std::string::npos);
  CHECK(e.find("--allow lora would make it fit (lora openpi)") != std::string::npos);

  o.allow = {AllowedChange::kFreeze};
  const PlanResult expert = plan(h200_profile(), kH200Profile, o);
  CHECK(expert.used == std::set<AllowedChange>{AllowedChange::kFreeze});
  CHECK(expert.recipe.freeze.presets == std::vector<formats::FreezePreset>{formats::FreezePreset::kTrainExpertOnly});
  CHECK(expert.global_batch == 32);
  CHECK(*expert.recipe.predicted.peak_gib <= 20 * kDefaultBudgetFraction);
  const formats::Rationale& first = expert.recipe.rationale.at(0);
  CHECK(first.decision == "freeze train_expert_only");
  CHECK(first.reason.rfind("allowed by --allow freeze; ", 0) == 0);
  CHECK(first.reason.find("without it nothing fits the 19.0 GiB budget") != std::string::npos);
  CHECK(first.reason.find("retune the learning rate") != std::string::npos);
  CHECK(recipe_to_json(expert.recipe)["freeze"]["presets"] == nlohmann::json::array({"train_expert_only"}));
  CHECK(format_explain(expert).find("- trains: freeze train_expert_only") != std::string::npos);

  // A budget the vision encoder's freezing meets: it is taken although freezing more predicts more samples/s.
  o.memory_budget_gib = 25;
  PlanOptions stated = o;
  stated.allow.clear();
  REQUIRE_FALSE(plan_error(stated).empty());  // full training does not fit
  const PlanResult vision = plan(h200_profile(), kH200Profile, o);
  CHECK(vision.recipe.freeze.presets ==
        std::vector<formats::FreezePreset>{formats::FreezePreset::kFreezeVisionEncoder});
  CHECK(vision.recipe.rationale.at(0).decision == "freeze freeze_vision_encoder");
  CHECK(vision.predicted.samples_per_s < expert.predicted.samples_per_s);
  CHECK(vision.recipe.lora.preset == std::nullopt);
}

TEST_CASE("Freezing the vision encoder frees exactly its gradients and moments, its backward and its activations",
          "[tuner][freeze]") {
  const CostModel full = build_cost_model(h200_profile(), kH200Profile);
  const CostModel m = priced(preset(formats::FreezePreset::kFreezeVisionEncoder));
  const TrainableChange& t = m.trainable;
  const std::string tower = layout::kVisionTower;
  const double p = row(0, tower, "parameter_bytes");  // bf16: 2 bytes per parameter
  const double total = h200_json()["batches"][0]["memory"]["parameter_bytes"].get<double>();
  CHECK(t.frozen_parameter_bytes == p);
  CHECK(t.adapter_numel == 0);
  // Gradients (the parameters' bytes) and two bf16 moments (twice that) no longer exist.
  CHECK(t.state_delta_gib * kGiB == Approx(-(p + 2 * p)).epsilon(1e-12));
  CHECK(t.fixed_gib * kGiB == Approx(-2 * p).epsilon(1e-12));
  CHECK(t.optimizer_ms == Approx(full.optimizer_ms * (total - p) / total).epsilon(1e-12));
  // The tower's whole backward, in proportion to the micro-batch; no GEMM outside it is frozen.
  CHECK(t.no_backward == std::vector<std::string>{tower});
  CHECK(t.backward_removed_ms.at(32) == Approx(row(0, tower, "backward_ms")).epsilon(1e-12));
  CHECK(t.backward_removed_ms.at(8) == Approx(row(0, tower, "backward_ms") / 4).epsilon(1e-12));
  CHECK(t.activation_removed_bytes.at(32) == Approx(row(0, tower, "activation_bytes")).epsilon(1e-12));
  CHECK(t.gemm_removed_ms == 0);
  for (size_t u = 0; u < m.units.size(); ++u)
    CHECK(static_cast<bool>(t.unit_no_backward[u]) == formats::fqn_within(m.units[u].spec.aliases[0], tower));

  // In the prediction: at batch 32 without accumulation the peak loses the moments and the tower's activations (the
  // profiled peak held fewer gradients than still train); with accumulation all its gradients too.
  const Candidate c32{32, {}, {}, 0};
  const double vision_bwd = row(0, tower, "backward_ms");
  CHECK(predict(m, c32).step_ms - predict(full, c32).step_ms ==
        Approx(-vision_bwd + t.optimizer_ms - full.optimizer_ms).epsilon(1e-9));
  CHECK((predict(m, c32).peak_gib - predict(full, c32).peak_gib) * kGiB ==
        Approx(-2 * p - row(0, tower, "activation_bytes")).epsilon(1e-9));
  const Candidate c16{16, {}, {}, 0};
  CHECK((predict(m, c16, 2).peak_gib - predict(full, c16, 2).peak_gib) * kGiB ==
        Approx(-3 * p - row(0, tower, "activation_bytes") / 2).epsilon(1e-9));
  CHECK(predict(m, c16, 2).step_ms - predict(full, c16, 2).step_ms ==
        Approx(-vision_bwd + t.optimizer_ms - full.optimizer_ms).epsilon(1e-9));
}

TEST_CASE("train_expert_only runs no backward through PaliGemma but keeps the expert's layers and the joint attention",
          "[tuner][freeze]") {
  const CostModel m = priced(preset(formats::FreezePreset::kTrainExpertOnly));
  const TrainableChange& t = m.trainable;
  REQUIRE(t.no_backward.size() == 3 + 18);
  double backward = row(0, layout::kVisionTower, "backward_ms") + row(0, layout::kProjector, "backward_ms") +
                    row(0, layout::kEmbedTokens, "backward_ms");
  for (int i = 0; i < 18; ++i)
    backward += row(0, layout::prefix_layer(i), "backward_ms") - row(0, layout::expert_layer(i), "backward_ms") -
                row(0, layout::prefix_layer(i) + ".self_attn", "backward_ms");
  CHECK(t.backward_removed_ms.at(32) == Approx(backward).epsilon(1e-9));
  for (size_t u = 0; u < m.units.size(); ++u) {
    const std::string& name = m.units[u].spec.aliases[0];
    const std::string kind = m.units[u].spec.kind;
    INFO(name);
    // The backbone's MLPs and the vision tower go; joint layers and attention and the expert's MLPs stay.
    CHECK(static_cast<bool>(t.unit_no_backward[u]) ==
          (kind == "backbone_mlp" || kind == "backbone_mlp_gate_up" || kind == "vision_tower" || kind == "vit_layer"));
    if (kind == "decoder_layer") CHECK(t.unit_act_removed[u].at(32) > 0);
  }
  // The planned peak cannot go below what the expert still holds: every candidate is priced.
  PlanOptions o;
  o.allow = {AllowedChange::kFreeze};
  o.memory_budget_gib = 12;
  o.global_batch = 32;
  const PlanResult r = plan(h200_profile(), kH200Profile, o);
  CHECK(r.recipe.freeze.presets == std::vector<formats::FreezePreset>{formats::FreezePreset::kTrainExpertOnly});
  for (const std::string& pattern : r.recipe.recompute.modules)
    CHECK(pattern.find("vision_tower") == std::string::npos);
}

TEST_CASE("LoRA adapters are rank x (members x k + n) elements per adapted GEMM, as training_state_bytes counts them",
          "[tuner][lora]") {
  // A merged q/k/v GEMM of three Linears [n_i, k] and a single one: adapter_costs against training_state_bytes.
  formats::Profile toy;
  formats::GemmEntry qkv;
  qkv.name = "t.attn.q_proj+k_proj+v_proj";
  qkv.members = {"t.attn.q_proj", "t.attn.k_proj", "t.attn.v_proj"};
  qkv.m = 64, qkv.k = 32, qkv.n = 48 + 8 + 8;
  formats::GemmEntry o = qkv;
  o.name = "t.attn.o_proj";
  o.members = {"t.attn.o_proj"};
  o.k = 48, o.n = 32;
  toy.gemms = {qkv, o};
  TrainableSelection sel;
  sel.frozen = {"t"};
  sel.lora = {{"t.attn.q_proj", 4}, {"t.attn.k_proj", 4}, {"t.attn.v_proj", 4}, {"t.attn.o_proj", 4}};
  const std::vector<ParameterShape> params = {{"t.attn.q_proj.weight", {48, 32}},
                                              {"t.attn.k_proj.weight", {8, 32}},
                                              {"t.attn.v_proj.weight", {8, 32}},
                                              {"t.attn.o_proj.weight", {32, 48}}};
  double numel = 0;
  for (const AdapterCost& a : adapter_costs(toy, sel, "test")) numel += a.numel;
  CHECK(numel == 4 * (3 * 32 + 64) + 4 * (48 + 32));
  CHECK(numel == training_state_bytes(params, sel, 2, formats::StateDtype::kAuto).adapter_numel);
  // A merged GEMM adapted in part cannot be sized: the members' widths are not in the inventory.
  sel.lora.pop_back();
  sel.lora.pop_back();
  CHECK_THROWS_WITH(adapter_costs(toy, sel, "--allow lora"),
                    Catch::Contains("--allow lora") && Catch::Contains("t.attn.q_proj+k_proj+v_proj"));

  // openpi's preset on the fixture: rank 16 on the language model's attention and MLP GEMMs, 32 on the expert's.
  formats::Recipe::Lora lora;
  lora.preset = formats::LoraPreset::kOpenpi;
  const CostModel m = priced({}, lora);
  double expected = 0;
  for (const auto& g : h200_json()["gemms"]) {
    const std::string first = g["members"][0];
    if (first.find(".dense") != std::string::npos) continue;  // the expert's adaRMS modulations: not adapted
    const bool prefix = first.rfind(layout::kPrefixLayerPrefix, 0) == 0;
    const bool expert = first.rfind(layout::kExpertLayerPrefix, 0) == 0;
    if (!prefix && !expert) continue;
    const double rank = prefix ? 16 : 32;
    expected += rank * (static_cast<double>(g["members"].size()) * g["k"].get<double>() + g["n"].get<double>());
  }
  CHECK(expected > 0);
  CHECK(m.trainable.adapter_numel == expected);
  // Both towers' own parameters freeze; the vision tower, the projector and the action/time projections train. The
  // expert's: its layers and final norm (the expert model launches nothing of its own, so it need not have a row).
  double frozen = row(0, layout::kEmbedTokens, "parameter_bytes") + row(0, layout::kExpertNorm, "parameter_bytes");
  double layers = 0;
  for (int i = 0; i < 18; ++i)
    layers += row(0, layout::prefix_layer(i), "parameter_bytes") + row(0, layout::expert_layer(i), "parameter_bytes");
  CHECK(m.trainable.frozen_parameter_bytes == frozen + layers);
  CHECK(m.trainable.gemm_removed_ms > 0);
  CHECK(m.trainable.adapter_ms > 0);
  // Only the token embedding runs no backward (a trainable projector feeds the language model).
  CHECK(m.trainable.no_backward == std::vector<std::string>{layout::kEmbedTokens});
}

TEST_CASE("--allow lora fits a budget only LoRA meets, and says so first", "[tuner][plan][lora]") {
  PlanOptions o;
  o.global_batch = 32;
  o.memory_budget_gib = 20;
  REQUIRE_FALSE(plan_error(o).empty());
  o.allow = {AllowedChange::kLora};
  const PlanResult r = plan(h200_profile(), kH200Profile, o);
  CHECK(r.used == std::set<AllowedChange>{AllowedChange::kLora});
  CHECK(r.recipe.lora.preset == formats::LoraPreset::kOpenpi);
  CHECK(r.recipe.freeze.presets.empty());
  CHECK(r.global_batch == 32);
  CHECK(*r.recipe.predicted.peak_gib <= 20 * kDefaultBudgetFraction);
  const formats::Rationale& first = r.recipe.rationale.at(0);
  CHECK(first.decision.rfind("lora openpi", 0) == 0);
  CHECK(first.reason.rfind("allowed by --allow lora; ", 0) == 0);
  CHECK(first.reason.find("an estimated") != std::string::npos);
  CHECK(first.reason.find("merges the adapters") != std::string::npos);
  CHECK(recipe_to_json(r.recipe)["lora"]["preset"] == "openpi");

  SECTION("the plan is compared with the profiled recipe as the profile measured it, not as LoRA would run it") {
    const formats::Rationale* summary = nullptr;
    for (const formats::Rationale& x : r.recipe.rationale)
      if (x.decision.rfind("predicted step ", 0) == 0) summary = &x;
    REQUIRE(summary != nullptr);
    CHECK(summary->reason.rfind("vs the profiled recipe as measured at micro-batch 32", 0) == 0);
    const auto& b0 = h200_json()["batches"][0];
    CHECK(summary->numbers.at("profiled_step_ms") == Approx(b0["step_ms"].get<double>()).epsilon(1e-9));
    CHECK(summary->numbers.at("profiled_peak_gib") == Approx(b0["peak_gib"].get<double>()).epsilon(1e-9));
  }
}

TEST_CASE("Freezing and LoRA are planned against a profile of full training only", "[tuner][plan][errors]") {
  formats::Profile frozen = h200_profile();
  frozen.recipe.freeze.presets = {formats::FreezePreset::kFreezeVisionEncoder};
  PlanOptions o;
  o.allow = {AllowedChange::kFreeze};
  CHECK_THROWS_WITH(plan(frozen, kH200Profile, o),
                    Catch::Contains("--allow freeze") && Catch::Contains("$.recipe.freeze"));
  formats::Profile lora = h200_profile();
  lora.recipe.lora.preset = formats::LoraPreset::kOpenpi;
  o.allow = {AllowedChange::kLora};
  CHECK_THROWS_WITH(plan(lora, kH200Profile, o), Catch::Contains("--allow lora") && Catch::Contains("$.recipe.lora"));
  // Without --allow such a profile plans its own training.
  CHECK_NOTHROW(plan(frozen, kH200Profile, PlanOptions{}));
}
