// The planner prices optimizer.state_dtype: AdamW's moments move the predicted peak by their bytes, the plan carries
// the key, and a profile without parameter bytes is refused naming the flag.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>

#include "formats/json_io.h"
#include "formats/profile.h"
#include "formats/recipe.h"
#include "profile_fixtures.h"
#include "tuner/cost_model.h"
#include "tuner/planner.h"

using namespace vlatune;
using namespace vlatune::tuner;
using vlatune::test::kSyntheticProfile;

namespace {

bool has_decision(const formats::Recipe& r, const std::string& prefix) {
  for (const auto& why : r.rationale)
    if (why.decision.rfind(prefix, 0) == 0) return true;
  return false;
}

}  // namespace

TEST_CASE("8-bit moments take 1 B per element per moment plus an fp32 absmax per 256", "[tuner][optimizer]") {
  CHECK(adamw_moment_bytes(1000, 2, formats::StateDtype::kAuto) == 4000);
  CHECK(adamw_moment_bytes(1000, 4, formats::StateDtype::kAuto) == 8000);
  CHECK(adamw_moment_bytes(1000, 2, formats::StateDtype::kInt8Blockwise) == 2 * (1000 + 4 * 4));
  CHECK(adamw_moment_bytes(1000, 4, formats::StateDtype::kInt8Blockwise) == 2 * (1000 + 4 * 4));
}

TEST_CASE("--optimizer-state int8-blockwise lowers the predicted peak by the moments' bytes and is in the recipe",
          "[tuner][plan][optimizer]") {
  const formats::Profile profile = formats::read_profile(kSyntheticProfile);
  REQUIRE(profile.recipe.optimizer.state_dtype == formats::StateDtype::kAuto);
  PlanOptions o;
  o.batch = 16;
  const PlanResult full = plan(profile, kSyntheticProfile, o);
  o.optimizer_state = formats::StateDtype::kInt8Blockwise;
  const PlanResult int8 = plan(profile, kSyntheticProfile, o);
  CHECK(int8.recipe.optimizer.state_dtype == formats::StateDtype::kInt8Blockwise);
  CHECK(full.recipe.optimizer.state_dtype == formats::StateDtype::kAuto);
  CHECK(has_decision(int8.recipe, "optimizer state int8-blockwise"));
  CHECK_FALSE(has_decision(full.recipe, "optimizer state"));
  // The profile's bf16 moments (memory.optimizer_bytes) against 8-bit codes and block scales of the same count.
  const double numel = static_cast<double>(*profile.batches[0].memory.parameter_bytes) / 2;
  REQUIRE(2 * 2 * numel == static_cast<double>(*profile.batches[0].memory.optimizer_bytes));
  const double delta_gib = (2 * (numel + 4 * std::ceil(numel / 256)) - 4 * numel) / kGiB;
  REQUIRE(int8.recipe.recompute.modules == full.recipe.recompute.modules);  // the budget is loose at batch 16
  CHECK(int8.predicted.peak_gib - full.predicted.peak_gib == Approx(delta_gib).epsilon(1e-9));
  CHECK(delta_gib == Approx(-6.15).margin(0.01));  // 3.35e9 parameters: 12.5 GiB of bf16 moments, 6.3 GiB in 8 bits

  // A budget the bf16 state cannot meet at this batch without recomputing more: the 8-bit plan needs less of it.
  o.memory_budget_gib = (full.predicted.peak_gib - 4) / kDefaultBudgetFraction;  // 4 GiB below, as planned
  const PlanResult tight = plan(profile, kSyntheticProfile, o);
  CHECK(*tight.recipe.predicted.peak_gib <= *o.memory_budget_gib);
  CHECK(tight.recipe.recompute.modules == int8.recipe.recompute.modules);
  o.optimizer_state = formats::StateDtype::kAuto;
  CHECK(plan(profile, kSyntheticProfile, o).recipe.recompute.modules != full.recipe.recompute.modules);
}

TEST_CASE("Planning another optimizer state needs the profile's parameter bytes", "[tuner][plan][optimizer]") {
  nlohmann::json j = formats::read_json_file(kSyntheticProfile);
  for (auto& b : j["batches"]) b["memory"]["parameter_bytes"] = nullptr;
  const formats::Profile profile = formats::parse_profile(j, "profile.json");
  PlanOptions o;
  o.batch = 16;
  CHECK_NOTHROW(plan(profile, "profile.json", o));  // the profiled state needs no sizes
  o.optimizer_state = formats::StateDtype::kInt8Blockwise;
  CHECK_THROWS_WITH(plan(profile, "profile.json", o), Catch::Contains("--optimizer-state int8-blockwise") &&
                                                          Catch::Contains("batches[0].memory.parameter_bytes"));
}

TEST_CASE("A sharded optimizer state counts 1/N of the moments per GPU, against the profile's own sharding",
          "[tuner][optimizer][zero]") {
  CostModel m;
  m.profile = formats::read_profile(kSyntheticProfile);
  REQUIRE_FALSE(m.profile.recipe.distributed.shard_optimizer_state);
  const double numel = static_cast<double>(*m.profile.batches[0].memory.parameter_bytes) / 2;  // bf16 parameters
  const double moments_gib = 2 * 2 * numel / kGiB;
  CHECK(plan_optimizer_state(m, formats::StateDtype::kAuto, 1) == 0);
  CHECK(plan_optimizer_state(m, formats::StateDtype::kAuto, 4) == Approx(-moments_gib * 3 / 4).epsilon(1e-12));
  CHECK(m.optimizer_delta_gib == Approx(-moments_gib * 3 / 4).epsilon(1e-12));
  const double int8_gib = 2 * (numel + 4 * std::ceil(numel / 256)) / kGiB;
  CHECK(plan_optimizer_state(m, formats::StateDtype::kInt8Blockwise, 2) ==
        Approx(int8_gib / 2 - moments_gib).epsilon(1e-12));

  // Profiled with the state sharded over its 2 processes: that is what its peak holds.
  m.profile.recipe.distributed.shard_optimizer_state = true;
  m.profile.environment.world_size = 2;
  CHECK(plan_optimizer_state(m, formats::StateDtype::kAuto, 2) == 0);
  CHECK(plan_optimizer_state(m, formats::StateDtype::kAuto, 1) == Approx(moments_gib / 2).epsilon(1e-12));
  CHECK(plan_optimizer_state(m, formats::StateDtype::kAuto, 8) ==
        Approx(moments_gib / 8 - moments_gib / 2).epsilon(1e-12));
}
