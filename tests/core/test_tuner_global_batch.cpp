// The plan keeps the global batch (micro-batch x grad_accum x world size) unless --allow global-batch, prices
// accumulation (the optimizer once per step, the gradients held through the later forward passes), and takes the
// 8-bit optimizer state only under --allow optimizer-state, saying so first in its rationale.
#include <catch2/catch.hpp>

#include <string>

#include "formats/numbers.h"
#include "formats/profile.h"
#include "formats/recipe.h"
#include "profile_fixtures.h"
#include "tuner/cost_model.h"
#include "tuner/planner.h"

using namespace vlatune;
using namespace vlatune::tuner;
using vlatune::test::kSyntheticProfile;
using vlatune::test::synthetic_profile;

namespace {

int64_t global_batch(const formats::Recipe& r) {
  return static_cast<int64_t>(r.batch.micro_batch) * r.batch.grad_accum * r.distributed.world_size;
}

std::string input_error_of(const PlanOptions& o) {
  try {
    plan(synthetic_profile(), kSyntheticProfile, o);
  } catch (const PlanInputError& e) {
    return e.what();
  }
  FAIL("planned despite the error");
  throw;
}

// The least peak a plan keeping global batch 32 can reach (micro-batch 1, every candidate recomputed).
double least_peak_at_global_32() {
  PlanOptions o;
  o.memory_budget_gib = 1;
  const std::string e = input_error_of(o);
  const size_t at = e.find("recomputing every candidate: ");
  REQUIRE(at != std::string::npos);
  return std::stod(e.substr(at + std::string("recomputing every candidate: ").size()));
}

}  // namespace

TEST_CASE("a budget that forces a smaller micro-batch raises grad_accum and keeps the global batch",
          "[tuner][plan][batch]") {
  PlanOptions o;
  const PlanResult loose = plan(synthetic_profile(), kSyntheticProfile, o);
  CHECK(loose.recipe.batch.micro_batch == 32);
  CHECK(loose.recipe.batch.grad_accum == 1);
  o.memory_budget_gib = 36;
  const PlanResult r = plan(synthetic_profile(), kSyntheticProfile, o);
  CHECK(r.recipe.batch.micro_batch < 32);
  CHECK(r.recipe.batch.grad_accum > 1);
  CHECK(global_batch(r.recipe) == 32);
  CHECK(r.global_batch == 32);
  CHECK(r.used.empty());
  CHECK(*r.recipe.predicted.peak_gib <= 36.0);
  // An optimizer step is grad_accum micro-batches and one update: samples/s counts the whole global batch.
  CHECK(r.predicted.samples_per_s == Approx(32 / (r.predicted.step_ms / 1e3)));
  bool said = false;
  for (const auto& x : r.recipe.rationale)
    said = said || (x.decision == "micro-batch " + std::to_string(r.recipe.batch.micro_batch) + " x grad_accum " +
                                      std::to_string(r.recipe.batch.grad_accum) &&
                    x.reason.find("global batch 32 kept") != std::string::npos);
  CHECK(said);
  CHECK(format_explain(r).find("global batch 32") != std::string::npos);
}

TEST_CASE("accumulation runs the optimizer once per step and holds the gradients through later forward passes",
          "[tuner][cost][batch]") {
  const CostModel m = build_cost_model(synthetic_profile(), kSyntheticProfile);
  CHECK(m.optimizer_ms == 12.0);  // the <optimizer> row's self time
  const Candidate c{8, m.baseline_units, {}, 0.0};
  const Prediction one = predict(m, c, 1);
  const Prediction four = predict(m, c, 4);
  CHECK(four.step_ms == Approx(4 * (one.step_ms - m.optimizer_ms) + m.optimizer_ms));
  CHECK(four.samples_per_s == Approx(32 / (four.step_ms / 1e3)));
  // The gradients (6.25 GiB) less what the profiled backward peak already held above its forward peak.
  const double held = 90.1 - 88.9;  // at batch 32 and at batch 16 alike (58.3 - 57.1)
  CHECK(four.peak_gib - one.peak_gib == Approx(m.gradient_gib - held));
  CHECK(m.gradient_gib == Approx(6706863648.0 / kGiB));
}

TEST_CASE("--global-batch and --batch must agree, naming both flags", "[tuner][plan][batch][errors]") {
  PlanOptions o;
  o.global_batch = 24;
  o.batch = 16;
  const std::string e = input_error_of(o);
  CHECK(e.find("--batch 16 does not divide --global-batch 24") != std::string::npos);
  CHECK(e.find("--allow global-batch") != std::string::npos);
  o.batch = 12;
  const PlanResult r = plan(synthetic_profile(), kSyntheticProfile, o);
  CHECK(r.recipe.batch.micro_batch == 12);
  CHECK(r.recipe.batch.grad_accum == 2);
  SECTION("the profiled global batch over a world size that does not divide it") {
    PlanOptions w;
    w.world_size = 3;
    w.allreduce_gbps = 100;
    const std::string we = input_error_of(w);
    CHECK(we.find("--world-size 3 does not divide the profiled recipe's global batch 32") != std::string::npos);
    CHECK(we.find("--global-batch N") != std::string::npos);
  }
  SECTION("a global batch below one sample per GPU") {
    o.global_batch = 0;
    o.batch.reset();
    CHECK(input_error_of(o).find("--global-batch") != std::string::npos);
  }
}

TEST_CASE("--allow global-batch restores the most samples/s at any micro-batch, and says so first",
          "[tuner][plan][batch]") {
  PlanOptions o;
  o.memory_budget_gib = 36;
  const PlanResult kept = plan(synthetic_profile(), kSyntheticProfile, o);
  o.allow = {AllowedChange::kGlobalBatch};
  const PlanResult any = plan(synthetic_profile(), kSyntheticProfile, o);
  // The profiled grad_accum (1) at the largest micro-batch that fits: the old behaviour.
  CHECK(any.recipe.batch.grad_accum == 1);
  CHECK(any.recipe.batch.micro_batch > kept.recipe.batch.micro_batch);
  CHECK(any.global_batch != 32);
  CHECK(any.predicted.samples_per_s > kept.predicted.samples_per_s);
  CHECK(any.used == std::set<AllowedChange>{AllowedChange::kGlobalBatch});
  REQUIRE_FALSE(any.recipe.rationale.empty());
  const formats::Rationale& first = any.recipe.rationale[0];
  CHECK(first.decision == "global batch 32 -> " + std::to_string(any.global_batch));
  CHECK(first.reason.rfind("allowed by --allow global-batch; ", 0) == 0);
  // Unconstrained, batch 32 stays (batch 40 predicts +1.5%, under the 2% an extrapolated batch needs): no change.
  PlanOptions loose;
  loose.allow = {AllowedChange::kGlobalBatch};
  const PlanResult same = plan(synthetic_profile(), kSyntheticProfile, loose);
  CHECK(same.global_batch == 32);
  CHECK(same.used.empty());
  CHECK(same.recipe.rationale[0].decision.rfind("global batch", 0) != 0);
}

TEST_CASE("--allow optimizer-state takes 8-bit moments only where the plan needs them, and says so first",
          "[tuner][plan][optimizer]") {
  PlanOptions o;
  o.allow = {AllowedChange::kOptimizerState};
  // A loose budget: micro-batch 32 already fits without recompute; 8-bit moments buy nothing.
  const PlanResult loose = plan(synthetic_profile(), kSyntheticProfile, o);
  CHECK(loose.recipe.optimizer.state_dtype == formats::StateDtype::kAuto);
  CHECK(loose.used.empty());
  // A budget below what global batch 32 needs with bf16 moments, above what it needs with 8-bit ones.
  const double least = least_peak_at_global_32();
  o.memory_budget_gib = least - 2;
  const PlanResult tight = plan(synthetic_profile(), kSyntheticProfile, o);
  CHECK(tight.recipe.optimizer.state_dtype == formats::StateDtype::kInt8Blockwise);
  CHECK(tight.used == std::set<AllowedChange>{AllowedChange::kOptimizerState});
  CHECK(global_batch(tight.recipe) == 32);
  CHECK(*tight.recipe.predicted.peak_gib <= least - 2);
  const formats::Rationale& first = tight.recipe.rationale.at(0);
  CHECK(first.decision == "optimizer state auto -> int8-blockwise");
  CHECK(first.reason.rfind("allowed by --allow optimizer-state; ", 0) == 0);
  CHECK(first.reason.find("without it nothing fits the") != std::string::npos);
  SECTION("without --allow the error names the choice that would fit, with its predicted peak") {
    PlanOptions stated;
    stated.memory_budget_gib = least - 2;
    const std::string e = input_error_of(stated);
    CHECK(e.find("memory budget " + formats::fixed((least - 2) * kDefaultBudgetFraction, 1) + " GiB (5% of the GPU") !=
          std::string::npos);
    CHECK(e.find("is below what micro-batch 1 x grad_accum 32 needs") != std::string::npos);
    CHECK(e.find("--allow optimizer-state would make it fit: micro-batch ") != std::string::npos);
    CHECK(e.find("at a predicted peak of ") != std::string::npos);
  }
  SECTION("a budget nothing meets says no --allow choice fits either") {
    PlanOptions stated;
    stated.memory_budget_gib = 5;
    CHECK(input_error_of(stated).find("no --allow choice makes it fit either") != std::string::npos);
    stated.allow = {AllowedChange::kGlobalBatch, AllowedChange::kOptimizerState, AllowedChange::kFreeze,
                    AllowedChange::kLora};
    CHECK(input_error_of(stated).find("every --allow choice considered") != std::string::npos);
  }
}

TEST_CASE("--allow parses comma-separated choices and names the known ones", "[tuner][plan][errors]") {
  CHECK(parse_allowed_changes("global-batch") == std::set<AllowedChange>{AllowedChange::kGlobalBatch});
  CHECK(parse_allowed_changes("optimizer-state, global-batch") ==
        std::set<AllowedChange>{AllowedChange::kGlobalBatch, AllowedChange::kOptimizerState});
  CHECK(parse_allowed_changes("lora,freeze") == std::set<AllowedChange>{AllowedChange::kFreeze, AllowedChange::kLora});
  CHECK_THROWS_WITH(parse_allowed_changes("freez"),
                    Catch::Contains("--allow: unknown choice 'freez'") &&
                        Catch::Contains("(known: global-batch, optimizer-state, freeze, lora;"));
  CHECK_THROWS_WITH(parse_allowed_changes(""), Catch::Contains("--allow"));
  CHECK(allow_flag({AllowedChange::kOptimizerState, AllowedChange::kGlobalBatch}) ==
        "--allow global-batch,optimizer-state");
}
