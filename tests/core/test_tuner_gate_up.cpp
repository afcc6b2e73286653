// The recompute unit `...language_model.layers.i.mlp.gate_proj+up_proj` in the tuner: a candidate
// named by its merged GEMM (no module row), sized from the GEMM inventory (time: the GEMM's forward at the
// profiled precision; bytes: the profile's output bytes of the unit, else rows x N x 2), nested in its MLP and
// joint layer, calibrated by an A/B row of its class when the profile has one, and emitted as recipe patterns.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "formats/fqn_pattern.h"
#include "formats/profile.h"
#include "layout/pi05.h"
#include "tuner/cost_model.h"
#include "tuner/planner.h"

using namespace vlatune;
using namespace vlatune::tuner;
using namespace vlatune::layout;

namespace {

// An H200 profile made before the trainer had the gate+up unit (tests/fixtures/profile_h200_pi05.json as of commit
// c62eedc): no `recomputable` entry and no A/B row name the unit, so the cases can add them one at a time.
const std::string kH200 = std::string(VLATUNE_FIXTURES_DIR) + "/profile_h200_pi05_before_gate_up.json";
const std::string kPL = "paligemma_with_expert.paligemma.model.language_model.layers.";

const formats::Profile& h200() {
  static const formats::Profile p = formats::read_profile(kH200);
  return p;
}

std::string gate_up(int i) {
  return kPL + std::to_string(i) + ".mlp.gate_proj+up_proj";
}

const formats::GemmEntry& gemm_named(const formats::Profile& p, const std::string& name) {
  for (const auto& g : p.gemms)
    if (g.name == name) return g;
  FAIL("no GEMM " << name);
  throw;
}

const UnitModel& unit_named(const CostModel& m, const std::string& name) {
  for (const auto& u : m.units)
    if (u.spec.aliases[0] == name) return u;
  FAIL("no unit " << name);
  throw;
}

std::vector<const UnitModel*> gate_up_units(const CostModel& m) {
  std::vector<const UnitModel*> out;
  for (const auto& u : m.units)
    if (u.spec.kind == "backbone_mlp_gate_up") out.push_back(&u);
  return out;
}

}  // namespace

TEST_CASE("unit_kind and unit_covers know the merged gate+up output unit", "[tuner][layout]") {
  CHECK(unit_kind(gate_up(3)) == "backbone_mlp_gate_up");
  CHECK(unit_kind("paligemma_with_expert.gemma_expert.model.layers.3.mlp.gate_proj+up_proj").empty());
  CHECK(unit_covers(gate_up(3), kPL + "3.mlp.gate_proj"));
  CHECK(unit_covers(gate_up(3), kPL + "3.mlp.up_proj"));
  CHECK_FALSE(unit_covers(gate_up(3), kPL + "3.mlp.down_proj"));
  CHECK_FALSE(unit_covers(gate_up(3), kPL + "3.mlp"));
  CHECK_FALSE(unit_covers(gate_up(3), kPL + "13.mlp.gate_proj"));
  CHECK(unit_covers(kPL + "3.mlp", kPL + "3.mlp.gate_proj"));
  CHECK(unit_covers(kPL + "3", gate_up(3)));
  CHECK(forward_before(kPL + "3.mlp", gate_up(3)));
}

TEST_CASE("without an A/B row the gate+up units are sized from the GEMM inventory", "[tuner][cost][gate_up]") {
  // The fixture predates the unit: its `recomputable` list does not name it, so the candidates come from the GEMM
  // inventory's merged backbone gate+up GEMMs: layers 0..16 (the last layer's MLP is dead work: no GEMM row).
  const formats::Profile& p = h200();
  REQUIRE(std::none_of(p.recomputable.begin(), p.recomputable.end(),
                       [](const std::string& f) { return unit_kind(f) == "backbone_mlp_gate_up"; }));
  const CostModel m = build_cost_model(p, kH200);
  const auto units = gate_up_units(m);
  REQUIRE(units.size() == 17);
  CHECK(units.front()->spec.aliases == std::vector<std::string>{gate_up(0)});
  CHECK(units.back()->spec.aliases == std::vector<std::string>{gate_up(16)});
  const formats::GemmEntry& g = gemm_named(p, gate_up(3));
  const UnitModel& u = unit_named(m, gate_up(3));
  const double b = static_cast<double>(m.profiled_batch);
  CHECK(u.recompute_ms.at(b) == Approx(g.bf16.forward_ms));  // the profiled recipe runs it in bf16
  CHECK(u.act_bytes.at(b) == Approx(static_cast<double>(g.m) * static_cast<double>(g.n) * 2.0));
  CHECK(u.act_bytes.at(b) / kGiB == Approx(1.39).margin(0.01));
  CHECK(u.out_bytes.at(b) == 0.0);
  CHECK(u.recompute_ms.at(b / 2) == Approx(g.bf16.forward_ms / 2));  // M = batch x tokens
  CHECK(u.calibration.empty());
  CHECK(u.estimate.find("rows x N x 2") != std::string::npos);
  // Nested in its MLP, which is nested in the joint layer.
  REQUIRE(u.parent >= 0);
  const UnitModel& mlp = m.units[static_cast<size_t>(u.parent)];
  CHECK(mlp.spec.aliases[0] == kPL + "3.mlp");
  REQUIRE(mlp.parent >= 0);
  CHECK(m.units[static_cast<size_t>(mlp.parent)].spec.aliases[0] == kPL + "3");
  CHECK(mlp.act_bytes.at(b) >= u.act_bytes.at(b));
  // Recompute patterns resolve against the module rows plus these names.
  CHECK(std::count(m.recompute_names.begin(), m.recompute_names.end(), gate_up(16)) == 1);
  CHECK(std::count(m.recompute_names.begin(), m.recompute_names.end(), gate_up(17)) == 0);
  bool noted = false;
  for (const auto& n : m.notes) noted = noted || n.find("17 backbone_mlp_gate_up units") != std::string::npos;
  CHECK(noted);
}

TEST_CASE("without GEMM timings (--gemm-reps 0) a gate+up unit costs its FLOPs at the step's GEMM rate, not zero",
          "[tuner][cost][gate_up]") {
  formats::Profile p = h200();
  for (auto& g : p.gemms) g.bf16 = formats::GemmTimes{};  // what `vlatune profile --gemm-reps 0` records
  double gemm_ms = 0, flops = 0;
  for (const auto& k : p.batches[0].kernels)
    if (k.category == "gemm") gemm_ms += k.ms;
  for (const auto& g : p.gemms)
    flops += 6.0 * static_cast<double>(g.m) * static_cast<double>(g.n) * static_cast<double>(g.k);
  REQUIRE(gemm_ms > 0);
  const double tflops = flops / (gemm_ms * 1e9);
  CHECK(tflops > 100);  // a plausible H200 bf16 rate, not a unit slip
  CHECK(tflops < 1000);
  const CostModel m = build_cost_model(p, kH200);
  const formats::GemmEntry& g = gemm_named(p, gate_up(3));
  const UnitModel& u = unit_named(m, gate_up(3));
  const double b = static_cast<double>(m.profiled_batch);
  const double expected_ms =
      2.0 * static_cast<double>(g.m) * static_cast<double>(g.n) * static_cast<double>(g.k) / (tflops * 1e9);
  CHECK(u.recompute_ms.at(b) == Approx(expected_ms));
  CHECK(u.recompute_ms.at(b) > 1.0);  // 3 TFLOP of forward GEMM: milliseconds, never free
  CHECK(u.estimate.find("no GEMM timing in the profile (--gemm-reps 0)") != std::string::npos);
  // So with room to spare the plan recomputes nothing, where a free recompute won every unit before.
  PlanOptions o;
  o.batch = 32;
  const PlanResult r = plan(p, kH200, o);
  CHECK(r.recipe.recompute.modules.empty());
}

TEST_CASE("the gate+up unit's time follows the profiled FP8 set, and its bytes a recorded output size",
          "[tuner][cost][gate_up]") {
  formats::Profile p = h200();
  p.recipe.fp8.modules = {kPL + "*.mlp.gate_proj", kPL + "*.mlp.up_proj"};
  // A profile that records the unit's output bytes (a row of its own) uses them.
  formats::ModuleCost row;
  row.fqn = gate_up(5);
  row.kind = "MergedGemm";
  row.output_bytes = int64_t{1} << 30;
  row.activation_bytes = int64_t{1} << 30;
  p.batches[0].modules.push_back(row);
  const CostModel m = build_cost_model(p, "p.json");
  const double b = static_cast<double>(m.profiled_batch);
  const formats::GemmEntry& g = gemm_named(p, gate_up(3));
  REQUIRE(g.fp8);
  const double quant_share = *g.quant_ms * g.fp8->forward_ms / g.fp8->total();
  CHECK(unit_named(m, gate_up(3)).recompute_ms.at(b) == Approx(g.fp8->forward_ms + quant_share));
  CHECK(unit_named(m, gate_up(3)).estimate.find("FP8") != std::string::npos);
  CHECK(unit_named(m, gate_up(5)).act_bytes.at(b) == Approx(static_cast<double>(int64_t{1} << 30)));
  CHECK(unit_named(m, gate_up(5)).estimate.find("output_bytes") != std::string::npos);
}

TEST_CASE("an A/B row of class backbone_mlp_gate_up calibrates the gate+up units", "[tuner][cost][gate_up]") {
  formats::Profile p = h200();
  const CostModel before = build_cost_model(p, kH200);
  const double b = static_cast<double>(before.profiled_batch);
  double est_ms = 0, est_gib = 0;
  for (const UnitModel* u : gate_up_units(before)) {
    est_ms += u->recompute_ms.at(b);
    est_gib += (u->act_bytes.at(b) - u->out_bytes.at(b)) / kGiB;
  }
  formats::RecomputeCandidate row;
  row.name = "backbone_mlp_gate_up";
  row.patterns = {kPL + "*.mlp.gate_proj+up_proj"};
  row.added = true;
  row.step_ms_delta = 1.5 * est_ms;
  row.peak_gib_delta = -0.9 * est_gib;
  p.batches[0].recompute.push_back(row);
  const CostModel m = build_cost_model(p, "p.json");
  const UnitModel& u = unit_named(m, gate_up(7));
  CHECK(u.calibration == "backbone_mlp_gate_up");
  CHECK(u.recompute_ms.at(b) == Approx(1.5 * unit_named(before, gate_up(7)).recompute_ms.at(b)));
  CHECK(u.act_bytes.at(b) == Approx(0.9 * unit_named(before, gate_up(7)).act_bytes.at(b)));
  bool found = false;
  for (const auto& c : m.calibrations) {
    if (c.name != "backbone_mlp_gate_up") continue;
    found = true;
    CHECK(c.units == 17);
    CHECK(c.time_factor == Approx(1.5));
    CHECK(c.memory_factor == Approx(0.9));
  }
  CHECK(found);
}

TEST_CASE("the profile's recomputable list decides which gate+up units are candidates", "[tuner][cost][gate_up]") {
  formats::Profile p = h200();
  p.recomputable.push_back(gate_up(2));  // a profile of a trainer with the unit lists each one it can recompute
  p.recomputable.push_back(gate_up(17));
  const CostModel m = build_cost_model(p, "p.json");
  const auto units = gate_up_units(m);
  REQUIRE(units.size() == 1);  // layer 17's MLP did not run (no GEMM row): no unit
  CHECK(units[0]->spec.aliases[0] == gate_up(2));
  // A --recompute-candidate naming one is accepted; one the trainer cannot recompute is refused.
  CHECK_NOTHROW(build_cost_model(p, "p.json", {gate_up(2)}));
  CHECK_THROWS_AS(build_cost_model(p, "p.json", {gate_up(4)}), PlanInputError);
}

TEST_CASE("a profiled recipe that recomputes gate+up units is understood", "[tuner][cost][gate_up]") {
  formats::Profile p = h200();
  p.recipe.recompute.modules = {kPL + "0.mlp.gate_proj+up_proj", kPL + "1.mlp.gate_proj+up_proj"};
  for (auto& g : p.gemms)
    if (g.name == gate_up(0) || g.name == gate_up(1)) g.recomputed = true;
  const CostModel m = build_cost_model(p, "p.json");
  CHECK(m.baseline_units.size() == 2);
  CHECK(unit_named(m, gate_up(0)).baseline);
  // Predicting the profiled recipe reproduces the measurement.
  const Prediction base = predict(m, {m.profiled_batch, m.baseline_units, {}, 0.0});
  CHECK(base.step_ms == Approx(p.batches[0].step_ms));
  CHECK(base.peak_gib == Approx(*p.batches[0].peak_gib));
}

TEST_CASE("plan buys memory with gate+up units first: the cheapest GiB of the model", "[tuner][plan][gate_up]") {
  // The FP8 recipe's situation on the bf16 fixture: --fp8 auto, a budget about 13 GiB under the profiled peak.
  PlanOptions o;
  o.batch = 32;
  o.fp8_auto = true;
  o.memory_budget_gib = 55.5;
  const PlanResult r = plan(h200(), kH200, o);
  REQUIRE(r.recipe.predicted.peak_gib);
  CHECK(*r.recipe.predicted.peak_gib <= 55.5);
  int gate_up_patterns = 0;
  for (const auto& pattern : r.recipe.recompute.modules)
    gate_up_patterns += unit_kind(pattern) == "backbone_mlp_gate_up" || pattern == kPL + "*.mlp.gate_proj+up_proj";
  CHECK(gate_up_patterns > 0);
  // The patterns resolve against the module rows plus the gate+up names, without nesting.
  const CostModel m = build_cost_model(h200(), kH200);
  CHECK_NOTHROW(formats::resolve_patterns(r.recipe.recompute.modules, m.recompute_names, "r.json", "$"));
  // --explain says how the uncalibrated units were estimated.
  const std::string text = format_explain(r);
  CHECK(text.find("backbone_mlp_gate_up units") != std::string::npos);
  CHECK(text.find("rows x N x 2") != std::string::npos);
  // Cheaper per GiB than any other unit: the solver takes them before whole MLPs or layers.
  for (const auto& pattern : r.recipe.recompute.modules) {
    INFO(pattern);
    CHECK(unit_kind(pattern) != "backbone_mlp");
    CHECK(unit_kind(pattern) != "decoder_layer");
  }
}
