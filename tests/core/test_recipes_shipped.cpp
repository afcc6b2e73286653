// Every shipped recipe (recipes/*.json) and the README's example parse as valid recipes; the FP8 recipe is the
// planner's.
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

#include "formats/json_io.h"
#include "formats/recipe.h"
#include "profile_fixtures.h"
#include "tuner/planner.h"

using namespace vlatune::formats;

TEST_CASE("Every shipped recipe parses", "[recipes][recipe]") {
  const std::string dir = std::string(VLATUNE_RECIPES_DIR);
  int parsed = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".json") continue;
    INFO(entry.path().string());
    CHECK_NOTHROW(read_recipe(entry.path().string()));
    ++parsed;
  }
  REQUIRE(parsed > 0);
}

TEST_CASE("The shipped defaults recipe is exactly the default recipe", "[recipes][recipe]") {
  const Recipe r = read_recipe(std::string(VLATUNE_RECIPES_DIR) + "/pi05_libero_defaults.json");
  CHECK(r == Recipe{});
}

TEST_CASE("The recipes README example parses", "[recipes][recipe]") {
  const std::string path = std::string(VLATUNE_RECIPES_DIR) + "/README.md";
  const std::string text = read_text_file(path);
  const std::string marker = "## Example";
  const size_t section = text.find(marker);
  REQUIRE(section != std::string::npos);
  const size_t open = text.find("```json\n", section);
  REQUIRE(open != std::string::npos);
  const size_t begin = open + 8;
  const size_t close = text.find("```", begin);
  REQUIRE(close != std::string::npos);
  const Recipe r = parse_recipe(parse_json_text(text.substr(begin, close - begin), path), path);
  CHECK(r.batch.micro_batch == 64);
  CHECK(r.recompute.modules.size() == 1);
  CHECK(r.fp8.modules.size() == 3);
}

TEST_CASE("The shipped FP8 recipe is what plan --fp8 auto --batch 32 --memory-budget 57 writes from its profile",
          "[recipes][recipe][tuner]") {
  const Recipe shipped = read_recipe(std::string(VLATUNE_RECIPES_DIR) + "/pi05_libero_h200_fp8.json");
  REQUIRE(shipped.tuned_on.profile == "tests/fixtures/profile_h200_pi05_fp8.json");
  vlatune::tuner::PlanOptions o;
  o.fp8_auto = true;
  o.batch = 32;
  o.memory_budget_gib = 57.0;
  const Recipe planned = vlatune::tuner::plan(vlatune::formats::read_profile(vlatune::test::kH200Fp8Profile),
                                              vlatune::test::kH200Fp8Profile, o)
                             .recipe;
  CHECK(planned.batch.micro_batch == shipped.batch.micro_batch);
  CHECK(planned.batch.grad_accum == shipped.batch.grad_accum);
  CHECK(planned.recompute.modules == shipped.recompute.modules);
  CHECK(planned.fp8.modules == shipped.fp8.modules);
  CHECK(planned.fp8.scaling == shipped.fp8.scaling);
  CHECK(planned.fp8.saved_geglu_inputs == SavedGegluInputs::kE4m3Blocks);
  CHECK(shipped.fp8.saved_geglu_inputs == SavedGegluInputs::kE4m3Blocks);
  CHECK(planned.fp8.gemm_algorithm == vlatune::formats::Fp8GemmAlgorithm::kTimed);
  CHECK(shipped.fp8.gemm_algorithm == vlatune::formats::Fp8GemmAlgorithm::kTimed);
  REQUIRE(planned.predicted.step_ms);
  REQUIRE(shipped.predicted.step_ms);
  CHECK(*planned.predicted.step_ms == Approx(*shipped.predicted.step_ms).epsilon(1e-12));
  REQUIRE(planned.predicted.peak_gib);
  REQUIRE(shipped.predicted.peak_gib);
  CHECK(*planned.predicted.peak_gib == Approx(*shipped.predicted.peak_gib).epsilon(1e-12));
  // The one edit after planning: prompt trimming on (the profile ran untrimmed prompts).
  CHECK_FALSE(planned.data.trim_text);
  CHECK(shipped.data.trim_text);
}
