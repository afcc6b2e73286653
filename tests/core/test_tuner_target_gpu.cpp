// `vlatune plan --gpu NAME`: another GPU's memory as the budget, FP8 only where the GPU has it (from --gpu, the
// profile's compute capability, or the profiled GPU's name), what transfers said in the rationale; and the
// profiles plan refuses (an inference profile) or still reads (one older than the workload field).
#include <catch2/catch.hpp>

#include <string>

#include "formats/json_error.h"
#include "formats/json_io.h"
#include "formats/profile.h"
#include "formats/recipe.h"
#include "profile_fixtures.h"
#include "tuner/cost_model.h"
#include "tuner/gpus.h"
#include "tuner/planner.h"

using namespace vlatune;
using namespace vlatune::tuner;
using vlatune::test::kSyntheticProfile;
using vlatune::test::synthetic_profile;

namespace {

bool has_fp8_plan(const PlanResult& r) {
  return !r.recipe.fp8.modules.empty();
}

const formats::Rationale* find_decision(const formats::Recipe& r, const std::string& prefix) {
  for (const auto& x : r.rationale)
    if (x.decision.rfind(prefix, 0) == 0) return &x;
  return nullptr;
}

}  // namespace

TEST_CASE("the GPU table states vendor memory in bytes and each GPU's compute capability", "[tuner][gpu]") {
  CHECK(known_gpus().size() == 10);
  CHECK(find_gpu("RTX 4090").memory_bytes == 24e9);
  CHECK(find_gpu("rtx4090").name == "RTX 4090");
  CHECK(find_gpu("NVIDIA A100-80GB").capability == formats::ComputeCapability{8, 0});
  CHECK(find_gpu("h200").memory_bytes == 141e9);
  CHECK_FALSE(has_fp8(find_gpu("A100-40GB").capability));
  CHECK_FALSE(has_fp8(find_gpu("RTX A6000").capability));
  CHECK(has_fp8(find_gpu("L40S").capability));
  CHECK(has_fp8(find_gpu("H100").capability));
  CHECK_THROWS_WITH(find_gpu("GTX 1080"),
                    Catch::Contains("--gpu: unknown GPU 'GTX 1080'") && Catch::Contains("RTX 4090, L4, A10"));
  // A device name as the driver reports it gives the capability of its family.
  CHECK(capability_from_device_name("NVIDIA A100-SXM4-80GB") == formats::ComputeCapability{8, 0});
  CHECK(capability_from_device_name("NVIDIA A10") == formats::ComputeCapability{8, 6});
  CHECK(capability_from_device_name("NVIDIA GeForce RTX 4090") == formats::ComputeCapability{8, 9});
  CHECK(capability_from_device_name("NVIDIA H200") == formats::ComputeCapability{9, 0});
  CHECK_FALSE(capability_from_device_name("Tesla V100-SXM2-16GB"));
  CHECK(format_gpu_table().find("RTX 4090       24 GB  22.4 GiB") != std::string::npos);
}

TEST_CASE("plan --gpu plans another GPU's memory and says which predictions transfer", "[tuner][plan][gpu]") {
  PlanOptions o;
  o.gpu = "L40S";
  const PlanResult r = plan(synthetic_profile(), kSyntheticProfile, o);
  CHECK(r.budget_gib == Approx(48e9 / kGiB * 0.95));
  CHECK(r.budget_gib < 48e9 / kGiB);
  CHECK(*r.recipe.predicted.peak_gib <= r.budget_gib);
  CHECK(r.global_batch == 32);
  REQUIRE(r.timed_on);
  CHECK(*r.timed_on == "NVIDIA H200");
  const formats::Rationale* target = find_decision(r.recipe, "target GPU L40S (profiled on NVIDIA H200)");
  REQUIRE(target);
  CHECK(target->reason.find("memory transfers") != std::string::npos);
  CHECK(target->reason.find("Time does not") != std::string::npos);
  const std::string text = format_explain(r);
  CHECK(text.find("the peak transfers to the target GPU, the time does not") != std::string::npos);
  SECTION("--memory-budget still wins") {
    o.memory_budget_gib = 40;
    CHECK(plan(synthetic_profile(), kSyntheticProfile, o).budget_gib == Approx(40 * kDefaultBudgetFraction));
  }
  SECTION("an RTX 4090: 24 GB, a budget nothing fits without --allow") {
    o.gpu = "RTX 4090";
    try {
      plan(synthetic_profile(), kSyntheticProfile, o);
      FAIL("full fine-tuning at global batch 32 planned in 21.2 GiB with bf16 moments");
    } catch (const PlanInputError& e) {
      CHECK(std::string(e.what()).find(
                "memory budget 21.2 GiB (5% of the GPU or of --memory-budget left to the allocator) is below") !=
            std::string::npos);
    }
  }
  SECTION("an unknown GPU is a bad flag listing the known ones") {
    o.gpu = "Voodoo 2";
    CHECK_THROWS_WITH(plan(synthetic_profile(), kSyntheticProfile, o), Catch::Contains("known: RTX 3090"));
  }
}

TEST_CASE("plan never proposes FP8 on a GPU without it", "[tuner][plan][gpu][fp8]") {
  PlanOptions o;
  o.fp8_auto = true;
  o.batch = 32;
  REQUIRE(has_fp8_plan(plan(synthetic_profile(), kSyntheticProfile, o)));  // the H200 profile: FP8 winners
  SECTION("--gpu A100-80GB") {
    o.gpu = "A100-80GB";
    const PlanResult r = plan(synthetic_profile(), kSyntheticProfile, o);
    CHECK_FALSE(has_fp8_plan(r));
    CHECK(r.predicted.fp8_ms == 0);
    const formats::Rationale* off = find_decision(r.recipe, "FP8 off");
    REQUIRE(off);
    CHECK(off->reason.find("A100-80GB has compute capability 8.0") != std::string::npos);
    CHECK(off->reason.find("8.9 or newer") != std::string::npos);
  }
  SECTION("a profile made on an A6000 (its compute capability recorded)") {
    formats::Profile p = synthetic_profile();
    p.environment.gpu = "NVIDIA RTX A6000";
    p.settings.compute_capability = formats::ComputeCapability{8, 6};
    CHECK_FALSE(has_fp8_plan(plan(p, kSyntheticProfile, o)));
  }
  SECTION("a profile made on an A100 that records no compute capability: known by the GPU's name") {
    formats::Profile p = synthetic_profile();
    p.environment.gpu = "NVIDIA A100-SXM4-80GB";
    REQUIRE_FALSE(p.settings.compute_capability);
    const PlanResult r = plan(p, kSyntheticProfile, o);
    CHECK_FALSE(has_fp8_plan(r));
    CHECK(find_decision(r.recipe, "FP8 off")->reason.find("by its name") != std::string::npos);
  }
}

TEST_CASE("plan refuses an inference profile, naming the file and the field", "[tuner][plan][errors]") {
  nlohmann::json j = formats::read_json_file(kSyntheticProfile);
  j["settings"]["workload"] = "inference";
  const formats::Profile inference = formats::parse_profile(j, "inference.json");
  try {
    plan(inference, "inference.json", PlanOptions{});
    FAIL("planned an inference profile");
  } catch (const formats::FormatError& e) {
    CHECK(e.file() == "inference.json");
    CHECK(e.json_path() == "$.settings.workload");
    CHECK(e.reason().find("\"inference\": plan needs a training profile") != std::string::npos);
  }
  // A profile written before the field (the fixture has none) is a training profile.
  REQUIRE_FALSE(formats::read_json_file(kSyntheticProfile)["settings"].contains("workload"));
  CHECK(synthetic_profile().settings.workload == "train");
  CHECK_NOTHROW(plan(synthetic_profile(), kSyntheticProfile, PlanOptions{}));
}
