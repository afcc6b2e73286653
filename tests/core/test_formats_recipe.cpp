// recipe.json reader/writer: defaults, round trip, strict validation with file + JSON path, hash stability.
#include <catch2/catch.hpp>

#include "temp_dir.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

#include "formats/json_error.h"
#include "formats/recipe.h"

using namespace vlatune::formats;
using nlohmann::json;

using vlatune::test::TempDir;

namespace {

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

Recipe full_recipe() {
  Recipe r;
  r.batch.micro_batch = 64;
  r.batch.grad_accum = 2;
  r.data.num_images = 2;
  r.data.trim_text = false;
  r.data.trim_multiple = 8;
  r.model_options.skip_dead = false;
  r.model_options.attention = Attention::kMaterialized;
  r.model_options.attention_backend = AttentionBackend::kFlash;
  r.model_options.precision = Precision::kFp32Master;
  r.model_options.cuda_graph_step = true;
  r.recompute.modules = {"paligemma_with_expert.paligemma.model.language_model.layers.*.mlp"};
  r.fp8.modules = {"paligemma_with_expert.gemma_expert.model.layers.*.mlp.gate_proj", "action_out_proj"};
  r.groups = {{"vision", {"paligemma_with_expert.paligemma.model.vision_tower"}, true},
              {"layer.0", {"a.layers.0", "b.layers.0"}, false}};
  r.freeze.presets = {FreezePreset::kFreezeVisionEncoder};
  r.freeze.modules = {"action_in_proj"};
  r.lora.preset = LoraPreset::kOpenpi;
  r.lora.targets = {{{"paligemma_with_expert.paligemma.model.multi_modal_projector.linear"}, 8, 4.5}};
  r.optimizer.state_dtype = StateDtype::kInt8Blockwise;
  r.distributed.world_size = 8;
  r.distributed.reduce_dtype = ReduceDtype::kFp32;
  r.distributed.shard_optimizer_state = true;
  r.tuned_on.gpu = "NVIDIA H200";
  r.tuned_on.torch = "2.11.0+cu130";
  r.tuned_on.profile = "runs/p/profile.json";
  r.predicted.step_ms = 812.25;
  r.predicted.peak_gib = 101.5;
  r.predicted.samples_per_s = 0.1 + 0.2;  // not exactly representable: the text form must still round-trip
  r.rationale = {
      {"recompute the prefix MLPs", "0.8 ms per GiB saved", {{"ms_per_gib_saved", 0.8}, {"saved_gib", 11.2}}},
      {"micro_batch 64", "fits with 18 GiB to spare", {}}};
  return r;
}

// The FormatError of parsing `text` as "recipe.json", or a failure if it parses.
FormatError error_of(const std::string& text) {
  try {
    parse_recipe(json::parse(text), "recipe.json");
  } catch (const FormatError& e) {
    return e;
  }
  FAIL("accepted: " << text);
  throw;  // unreachable
}

}  // namespace

TEST_CASE("An empty recipe object gives every default of DESIGN.md", "[formats][recipe]") {
  const Recipe r = parse_recipe(json::object(), "recipe.json");
  CHECK(r == Recipe{});
  CHECK(r.schema == "vlatune.recipe/1");
  CHECK(r.model == "pi05");
  CHECK(r.batch.micro_batch == 32);
  CHECK(r.batch.grad_accum == 1);
  CHECK_FALSE(r.data.num_images.has_value());
  CHECK(r.data.trim_text);
  CHECK(r.data.trim_multiple == 16);
  CHECK(r.model_options.skip_dead);
  CHECK(r.model_options.attention == Attention::kLean);
  CHECK(r.model_options.precision == Precision::kBf16);
  CHECK_FALSE(r.model_options.cuda_graph_step);
  CHECK(r.recompute.modules.empty());
  CHECK(r.fp8.scaling == Fp8Scaling::kTensorwise);
  CHECK(r.fp8.modules.empty());
  CHECK(r.groups.empty());
  CHECK(r.distributed.world_size == 1);
  CHECK(r.distributed.reduce_dtype == ReduceDtype::kBf16);
  CHECK_FALSE(r.tuned_on.gpu.has_value());
  CHECK_FALSE(r.predicted.step_ms.has_value());
  CHECK(r.rationale.empty());
}

TEST_CASE("The canonical JSON of the default recipe is DESIGN.md's schema block", "[formats][recipe]") {
  const json expected = json::parse(R"({ "schema": "vlatune.recipe/1", "model": "pi05",
    "batch": {"micro_batch": 32, "grad_accum": 1},
    "data": {"num_images": null, "trim_text": true, "trim_multiple": 16},
    "model_options": {"skip_dead": true, "attention": "lean", "precision": "bf16"},
    "recompute": {"modules": []},
    "fp8": {"scaling": "tensorwise", "modules": []},
    "groups": [],
    "distributed": {"world_size": 1, "reduce_dtype": "bf16"},
    "tuned_on": {"gpu": null, "torch": null, "profile": null},
    "predicted": {"step_ms": null, "peak_gib": null, "samples_per_s": null},
    "rationale": [] })");
  CHECK(recipe_to_json(Recipe{}) == expected);
}

TEST_CASE("A recipe with every key set round-trips through a file", "[formats][recipe]") {
  TempDir dir("recipe");
  const std::string path = dir.file("recipe.json");
  const Recipe r = full_recipe();
  write_recipe(r, path);
  const Recipe back = read_recipe(path);
  CHECK(back == r);
  CHECK(recipe_to_json(back) == recipe_to_json(r));
  CHECK(recipe_hash(back) == recipe_hash(r));
}

TEST_CASE("A partial recipe keeps the defaults of the keys it leaves out", "[formats][recipe]") {
  const Recipe r = parse_recipe(json::parse(R"({"batch": {"grad_accum": 4}, "data": {"num_images": 1}})"), "r.json");
  CHECK(r.batch.micro_batch == 32);
  CHECK(r.batch.grad_accum == 4);
  CHECK(r.data.num_images == 1);
  CHECK(r.data.trim_multiple == 16);
}

TEST_CASE("Unknown recipe keys are rejected at their path, at every level", "[formats][recipe]") {
  CHECK(error_of(R"({"micro_batch": 3})").json_path() == "$.micro_batch");
  CHECK(error_of(R"({"batch": {"micro_bach": 3}})").json_path() == "$.batch.micro_bach");
  CHECK(error_of(R"({"groups": [{"name": "g", "modules": ["a"], "cuda_graphs": true}]})").json_path() ==
        "$.groups[0].cuda_graphs");
  CHECK(error_of(R"({"rationale": [{"decision": "d", "reason": "r", "why": "x"}]})").json_path() ==
        "$.rationale[0].why");
  CHECK(error_of(R"({"tuned_on": {"gpu": null, "host": "x"}})").json_path() == "$.tuned_on.host");
  CHECK_THAT(error_of(R"({"batch": {"micro_bach": 3}})").what(),
             Catch::Contains("recipe.json: $.batch.micro_bach: unknown key") &&
                 Catch::Contains("did you mean 'micro_batch'?"));
}

TEST_CASE("Wrong recipe value types are rejected with what was expected", "[formats][recipe]") {
  struct Case {
    const char* text;
    const char* path;
    const char* expected;
  };
  const Case cases[] = {
      {R"([])", "$", "expected an object, got an array"},
      {R"({"batch": 32})", "$.batch", "expected an object, got 32"},
      {R"({"batch": {"micro_batch": "32"}})", "$.batch.micro_batch", "got string \"32\""},
      {R"({"batch": {"micro_batch": 32.0}})", "$.batch.micro_batch", "expected an integer in 1..1048576"},
      {R"({"data": {"trim_text": 1}})", "$.data.trim_text", "expected true or false, got 1"},
      {R"({"data": {"num_images": "all"}})", "$.data.num_images", "or null, got string \"all\""},
      {R"({"recompute": {"modules": "a.b"}})", "$.recompute.modules", "expected an array"},
      {R"({"fp8": {"modules": ["a", "b", "c", 7]}})", "$.fp8.modules[3]", "expected a module pattern (string), got 7"},
      {R"({"groups": {}})", "$.groups", "expected an array"},
      {R"({"tuned_on": {"gpu": 3}})", "$.tuned_on.gpu", "expected a string or null, got 3"},
      {R"({"predicted": {"step_ms": "fast"}})", "$.predicted.step_ms", "expected a finite number >= 0 or null"},
      {R"({"rationale": ["because"]})", "$.rationale[0]", "expected an object"},
      {R"({"rationale": [{"decision": "d", "reason": "r", "numbers": {"x_ms": "1"}}]})", "$.rationale[0].numbers.x_ms",
       "expected a finite number"},
      {R"({"rationale": [{"decision": "d", "reason": "r", "numbers": [1]}]})", "$.rationale[0].numbers",
       "expected an object of numbers"},
  };
  for (const Case& c : cases) {
    INFO(c.text);
    const FormatError e = error_of(c.text);
    CHECK(e.file() == "recipe.json");
    CHECK(e.json_path() == c.path);
    CHECK_THAT(e.reason(), Catch::Contains(c.expected));
    CHECK_THAT(e.what(), Catch::StartsWith(std::string("recipe.json: ") + c.path + ": "));
  }
}

TEST_CASE("fp8.scaling reads and writes both scaling modes", "[formats][recipe]") {
  for (const auto& [text, value] :
       {std::pair<const char*, Fp8Scaling>{"tensorwise", Fp8Scaling::kTensorwise}, {"delayed", Fp8Scaling::kDelayed}}) {
    const Recipe r = parse_recipe(json::parse(std::string(R"({"fp8": {"scaling": ")") + text + "\"}}"), "recipe.json");
    CHECK(r.fp8.scaling == value);
    CHECK(recipe_to_json(r)["fp8"]["scaling"] == text);
    CHECK(recipe_to_json(parse_recipe(recipe_to_json(r), "recipe.json")) == recipe_to_json(r));
  }
}

TEST_CASE("Bad recipe enum values list the allowed ones", "[formats][recipe]") {
  CHECK_THAT(error_of(R"({"model_options": {"attention": "fast"}})").what(),
             Catch::Equals("recipe.json: $.model_options.attention: expected one of \"lean\", \"materialized\", got "
                           "string \"fast\""));
  CHECK(error_of(R"({"model_options": {"precision": "fp32"}})").json_path() == "$.model_options.precision");
  CHECK_THAT(error_of(R"({"model_options": {"cuda_graph": true}})").what(),
             Catch::Contains("$.model_options.cuda_graph") && Catch::Contains("\"off\", \"step\""));
  CHECK(error_of(R"({"model_options": {"cuda_graph": "layer"}})").json_path() == "$.model_options.cuda_graph");
  CHECK(error_of(R"({"fp8": {"scaling": "rowwise"}})").json_path() == "$.fp8.scaling");
  CHECK_THAT(error_of(R"({"fp8": {"scaling": "current"}})").what(),
             Catch::Equals("recipe.json: $.fp8.scaling: expected one of \"tensorwise\", \"delayed\", got string "
                           "\"current\""));
  CHECK(error_of(R"({"distributed": {"reduce_dtype": "fp16"}})").json_path() == "$.distributed.reduce_dtype");
  CHECK(error_of(R"({"model": "pi0"})").json_path() == "$.model");
}

TEST_CASE("A recipe of another schema version is rejected", "[formats][recipe]") {
  const FormatError e = error_of(R"({"schema": "vlatune.recipe/2"})");
  CHECK(e.json_path() == "$.schema");
  CHECK_THAT(e.reason(), Catch::Contains("expected \"vlatune.recipe/1\", got string \"vlatune.recipe/2\""));
  CHECK(error_of(R"({"schema": 1})").json_path() == "$.schema");
}

TEST_CASE("Non-positive recipe sizes are rejected", "[formats][recipe]") {
  for (const char* text : {R"({"batch": {"micro_batch": 0}})", R"({"batch": {"grad_accum": -1}})",
                           R"({"data": {"num_images": 0}})", R"({"data": {"trim_multiple": 0}})",
                           R"({"distributed": {"world_size": 0}})", R"({"batch": {"micro_batch": 99999999999}})"}) {
    INFO(text);
    CHECK_THAT(error_of(text).reason(), Catch::StartsWith("expected an integer in 1..1048576"));
  }
  CHECK(error_of(R"({"predicted": {"peak_gib": -1}})").json_path() == "$.predicted.peak_gib");
}

TEST_CASE("Malformed recipe patterns are rejected at their index", "[formats][recipe]") {
  CHECK(error_of(R"({"recompute": {"modules": ["a.b", "a..b"]}})").json_path() == "$.recompute.modules[1]");
  CHECK(error_of(R"({"fp8": {"modules": ["a", "b", "c", "layers.1*"]}})").json_path() == "$.fp8.modules[3]");
  CHECK(error_of(R"({"groups": [{"name": "g", "modules": ["x", " y"]}]})").json_path() == "$.groups[0].modules[1]");
}

TEST_CASE("Recipe groups need a unique name and at least one module", "[formats][recipe]") {
  CHECK(error_of(R"({"groups": [{"modules": ["a"]}]})").json_path() == "$.groups[0].name");
  CHECK(error_of(R"({"groups": [{"name": "", "modules": ["a"]}]})").json_path() == "$.groups[0].name");
  CHECK(error_of(R"({"groups": [{"name": "g"}]})").json_path() == "$.groups[0].modules");
  CHECK(error_of(R"({"groups": [{"name": "g", "modules": []}]})").json_path() == "$.groups[0].modules");
  const FormatError dup = error_of(R"({"groups": [{"name": "g", "modules": ["a"]}, {"name": "g", "modules": ["b"]}]})");
  CHECK(dup.json_path() == "$.groups[1].name");
  CHECK_THAT(dup.reason(), Catch::Contains("duplicate group name 'g'") && Catch::Contains("$.groups[0].name"));
}

TEST_CASE("Reading a recipe names the file for missing files, bad JSON and bad values", "[formats][recipe]") {
  TempDir dir("recipe");
  CHECK_THROWS_WITH(read_recipe(dir.file("missing.json")), Catch::Contains("missing.json: cannot read"));
  const std::string bad = dir.file("bad.json");
  write_text(bad, "{\"batch\": {\"micro_batch\": 32,}}");
  CHECK_THROWS_WITH(read_recipe(bad), Catch::StartsWith(bad + ": not valid JSON: at byte 30"));
  const std::string dup = dir.file("dup.json");
  write_text(dup, R"({"batch": {"micro_batch": 32, "micro_batch": 64}})");
  CHECK_THROWS_WITH(read_recipe(dup), Catch::StartsWith(dup + ": $.batch.micro_batch: duplicate key"));
  const std::string wrong = dir.file("wrong.json");
  write_text(wrong, R"({"fp8": {"modules": ["a", "b", "c", 3]}})");
  CHECK_THROWS_WITH(read_recipe(wrong), Catch::StartsWith(wrong + ": $.fp8.modules[3]: "));
}

TEST_CASE("Writing an invalid recipe is refused and leaves no file", "[formats][recipe]") {
  TempDir dir("recipe");
  Recipe r;
  r.batch.micro_batch = 0;
  const std::string path = dir.file("r.json");
  CHECK_THROWS_WITH(write_recipe(r, path), Catch::StartsWith(path + ": $.batch.micro_batch: "));
  CHECK_FALSE(std::filesystem::exists(path));
  Recipe nan_prediction;
  nan_prediction.predicted.step_ms = std::numeric_limits<double>::quiet_NaN();
  CHECK_THROWS_WITH(write_recipe(nan_prediction, path), Catch::Contains("$.predicted.step_ms"));
}

TEST_CASE("The recipe hash ignores provenance, prediction, rationale and pattern order", "[formats][recipe]") {
  const Recipe base = full_recipe();
  const std::string h = recipe_hash(base);
  CHECK(h.size() == 16);
  CHECK(h.find_first_not_of("0123456789abcdef") == std::string::npos);

  Recipe explained = base;
  explained.tuned_on = {};
  explained.predicted.step_ms = 1.0;
  explained.rationale.clear();
  CHECK(recipe_hash(explained) == h);

  Recipe reordered = base;
  std::swap(reordered.fp8.modules[0], reordered.fp8.modules[1]);
  reordered.fp8.modules.push_back(reordered.fp8.modules[0]);
  CHECK(recipe_hash(reordered) == h);

  Recipe other = base;
  other.batch.grad_accum = 3;
  CHECK(recipe_hash(other) != h);
  Recipe eager = base;
  eager.model_options.cuda_graph_step = false;
  CHECK(recipe_hash(eager) != h);
  Recipe regrouped = base;
  std::swap(regrouped.groups[0], regrouped.groups[1]);
  CHECK(recipe_hash(regrouped) != h);
}

TEST_CASE("The hash of the default recipe is pinned", "[formats][recipe]") {
  // If this changes, every stored run.json stops matching its recipe: bump the schema instead.
  CHECK(recipe_hash(Recipe{}) == recipe_hash(parse_recipe(json::object(), "r.json")));
  CHECK(recipe_hash(Recipe{}) == "35a46b964672f4d0");
}

TEST_CASE("optimizer.state_dtype is written only when not auto, changes the hash and rejects unknown dtypes",
          "[formats][recipe]") {
  const Recipe int8 = parse_recipe(json::parse(R"({"optimizer": {"state_dtype": "int8-blockwise"}})"), "r.json");
  CHECK(int8.optimizer.state_dtype == StateDtype::kInt8Blockwise);
  CHECK(recipe_to_json(int8)["optimizer"] == json{{"state_dtype", "int8-blockwise"}});
  CHECK(parse_recipe(recipe_to_json(int8), "r.json") == int8);
  CHECK(recipe_hash(int8) != recipe_hash(Recipe{}));

  const Recipe automatic = parse_recipe(json::parse(R"({"optimizer": {"state_dtype": "auto"}})"), "r.json");
  CHECK(automatic == Recipe{});
  CHECK_FALSE(recipe_to_json(automatic).contains("optimizer"));

  CHECK_THAT(error_of(R"({"optimizer": {"state_dtype": "int8"}})").what(),
             Catch::Equals("recipe.json: $.optimizer.state_dtype: expected one of \"auto\", \"int8-blockwise\", got "
                           "string \"int8\""));
  CHECK(error_of(R"({"optimizer": {"state": "int8-blockwise"}})").json_path() == "$.optimizer.state");
}

TEST_CASE("fp8.saved_geglu_inputs is written only when not bf16, changes the hash and rejects unknown storages",
          "[formats][recipe]") {
  const Recipe blocks = parse_recipe(json::parse(R"({"fp8": {"saved_geglu_inputs": "e4m3-blocks"}})"), "r.json");
  CHECK(blocks.fp8.saved_geglu_inputs == SavedGegluInputs::kE4m3Blocks);
  CHECK(recipe_to_json(blocks)["fp8"]["saved_geglu_inputs"] == "e4m3-blocks");
  CHECK(parse_recipe(recipe_to_json(blocks), "r.json") == blocks);
  CHECK(recipe_hash(blocks) != recipe_hash(Recipe{}));
  CHECK(recipe_differences(Recipe{}, blocks) ==
        std::vector<std::string>{"fp8.saved_geglu_inputs: \"bf16\" vs \"e4m3-blocks\""});

  const Recipe bf16 = parse_recipe(json::parse(R"({"fp8": {"saved_geglu_inputs": "bf16"}})"), "r.json");
  CHECK(bf16 == Recipe{});
  CHECK_FALSE(recipe_to_json(bf16)["fp8"].contains("saved_geglu_inputs"));
  CHECK(recipe_hash(bf16) == recipe_hash(Recipe{}));
  CHECK_THAT(error_of(R"({"fp8": {"saved_geglu_inputs": "e4m3"}})").what(),
             Catch::Equals("recipe.json: $.fp8.saved_geglu_inputs: expected one of \"bf16\", \"e4m3-blocks\", got "
                           "string \"e4m3\""));
}

TEST_CASE("fp8.gemm_algorithm is written only when not heuristic, changes the hash and rejects unknown choices",
          "[formats][recipe]") {
  const Recipe timed = parse_recipe(json::parse(R"({"fp8": {"gemm_algorithm": "timed"}})"), "r.json");
  CHECK(timed.fp8.gemm_algorithm == Fp8GemmAlgorithm::kTimed);
  CHECK(recipe_to_json(timed)["fp8"]["gemm_algorithm"] == "timed");
  CHECK(parse_recipe(recipe_to_json(timed), "r.json") == timed);
  CHECK(recipe_hash(timed) != recipe_hash(Recipe{}));
  CHECK(recipe_differences(Recipe{}, timed) ==
        std::vector<std::string>{"fp8.gemm_algorithm: \"heuristic\" vs \"timed\""});

  const Recipe heuristic = parse_recipe(json::parse(R"({"fp8": {"gemm_algorithm": "heuristic"}})"), "r.json");
  CHECK(heuristic == Recipe{});
  CHECK_FALSE(recipe_to_json(heuristic)["fp8"].contains("gemm_algorithm"));
  CHECK(recipe_hash(heuristic) == recipe_hash(Recipe{}));
  CHECK_THAT(error_of(R"({"fp8": {"gemm_algorithm": "fastest"}})").what(),
             Catch::Equals("recipe.json: $.fp8.gemm_algorithm: expected one of \"heuristic\", \"timed\", got "
                           "string \"fastest\""));
  CHECK(error_of(R"({"fp8": {"gemm_algorithm": 1}})").json_path() == "$.fp8.gemm_algorithm");
}

TEST_CASE("distributed.shard_optimizer_state is written only when true, changes the hash and is named as a difference",
          "[formats][recipe]") {
  const Recipe sharded =
      parse_recipe(json::parse(R"({"distributed": {"world_size": 4, "shard_optimizer_state": true}})"), "r.json");
  CHECK(sharded.distributed.shard_optimizer_state);
  CHECK(recipe_to_json(sharded)["distributed"]["shard_optimizer_state"] == true);
  CHECK(parse_recipe(recipe_to_json(sharded), "r.json") == sharded);
  Recipe unsharded = sharded;
  unsharded.distributed.shard_optimizer_state = false;
  CHECK(recipe_hash(sharded) != recipe_hash(unsharded));
  CHECK_FALSE(recipe_to_json(unsharded)["distributed"].contains("shard_optimizer_state"));
  CHECK(recipe_differences(unsharded, sharded) ==
        std::vector<std::string>{"distributed.shard_optimizer_state: false vs true"});

  const Recipe explicit_false =
      parse_recipe(json::parse(R"({"distributed": {"shard_optimizer_state": false}})"), "r.json");
  CHECK(recipe_hash(explicit_false) == recipe_hash(Recipe{}));
  CHECK_THAT(error_of(R"({"distributed": {"shard_optimizer_state": "yes"}})").what(),
             Catch::StartsWith("recipe.json: $.distributed.shard_optimizer_state: expected true or false"));
}

TEST_CASE("model_options.attention_backend reads every backend, is written only when set, and enters the hash",
          "[formats][recipe]") {
  const std::vector<std::pair<std::string, AttentionBackend>> backends = {{"auto", AttentionBackend::kAuto},
                                                                          {"cudnn", AttentionBackend::kCudnn},
                                                                          {"flash", AttentionBackend::kFlash},
                                                                          {"sdpa", AttentionBackend::kSdpa}};
  for (const auto& [name, backend] : backends) {
    INFO(name);
    const Recipe r =
        parse_recipe(json::parse(R"({"model_options": {"attention_backend": ")" + name + R"("}})"), "recipe.json");
    CHECK(r.model_options.attention_backend == backend);
    CHECK(std::string(to_string(backend)) == name);
    const json written = recipe_to_json(r);
    CHECK(written["model_options"].contains("attention_backend") == (backend != AttentionBackend::kAuto));
    CHECK((recipe_hash(r) == recipe_hash(Recipe{})) == (backend == AttentionBackend::kAuto));
  }
  const FormatError e = error_of(R"({"model_options": {"attention_backend": "fast"}})");
  CHECK(e.json_path() == "$.model_options.attention_backend");
  CHECK_THAT(e.what(), Catch::Contains("\"auto\", \"cudnn\", \"flash\", \"sdpa\""));
}

TEST_CASE("The keys behind a recipe hash difference are named, pattern lists as sets", "[formats][recipe]") {
  const Recipe base = full_recipe();
  CHECK(recipe_differences(base, base).empty());
  Recipe explained = base;
  explained.predicted.step_ms = 1.0;
  std::swap(explained.fp8.modules[0], explained.fp8.modules[1]);
  CHECK(recipe_differences(base, explained).empty());  // equal hashes, no differences

  Recipe other = base;
  other.batch.micro_batch = 2;
  other.model_options.precision = Precision::kBf16;
  other.model_options.cuda_graph_step = false;
  other.fp8.modules.erase(other.fp8.modules.begin());
  other.fp8.modules.push_back("time_mlp_in");
  other.groups.pop_back();
  const std::vector<std::string> d = recipe_differences(base, other);
  REQUIRE(recipe_hash(base) != recipe_hash(other));
  auto has = [&d](const std::string& text) {
    for (const auto& line : d)
      if (line.find(text) != std::string::npos) return true;
    return false;
  };
  CHECK(has("batch.micro_batch: " + std::to_string(base.batch.micro_batch) + " vs 2"));
  CHECK(has("model_options.precision: \"fp32-master\" vs \"bf16\""));
  CHECK(has("model_options.cuda_graph: \"step\" vs \"off\""));
  CHECK(has("fp8.modules: added \"time_mlp_in\"; removed \"" + base.fp8.modules.front() + "\""));
  CHECK(
      has("groups: " + std::to_string(base.groups.size()) + " vs " + std::to_string(other.groups.size()) + " entries"));
  CHECK_FALSE(has("predicted"));
}

TEST_CASE("freeze and lora are written only when set, read back, and enter the hash", "[formats][recipe]") {
  CHECK_FALSE(recipe_to_json(Recipe{}).contains("freeze"));
  CHECK_FALSE(recipe_to_json(Recipe{}).contains("lora"));
  // Empty sections are the defaults: same JSON, same hash as leaving them out.
  const Recipe empty = parse_recipe(json::parse(R"({"freeze": {"presets": [], "modules": []},
                                                    "lora": {"preset": null, "targets": []}})"),
                                    "r.json");
  CHECK(empty == Recipe{});
  CHECK(recipe_hash(empty) == recipe_hash(Recipe{}));

  const Recipe r = parse_recipe(json::parse(R"({
      "freeze": {"presets": ["train_expert_only", "freeze_vision_encoder"], "modules": ["time_mlp_in"]},
      "lora": {"preset": "openpi", "targets": [{"modules": ["action_out_proj"], "rank": 4},
                                               {"modules": ["time_mlp_out"], "rank": 2, "alpha": 0.5}]}})"),
                                "r.json");
  REQUIRE(r.freeze.presets.size() == 2);
  CHECK(r.freeze.presets[0] == FreezePreset::kTrainExpertOnly);
  CHECK(r.freeze.modules == std::vector<std::string>{"time_mlp_in"});
  REQUIRE(r.lora.preset);
  CHECK(*r.lora.preset == LoraPreset::kOpenpi);
  REQUIRE(r.lora.targets.size() == 2);
  CHECK(r.lora.targets[0].rank == 4);
  CHECK(r.lora.targets[0].alpha == 4.0);  // absent: = rank
  CHECK(r.lora.targets[1].alpha == 0.5);
  const json j = recipe_to_json(r);
  CHECK(j["freeze"]["presets"] == json{"train_expert_only", "freeze_vision_encoder"});
  CHECK(j["lora"]["preset"] == "openpi");
  CHECK(j["lora"]["targets"][0] == json{{"modules", {"action_out_proj"}}, {"rank", 4}, {"alpha", 4.0}});
  CHECK(parse_recipe(j, "r.json") == r);

  // Preset order does not change the selection; rank and alpha do.
  Recipe swapped = r;
  std::swap(swapped.freeze.presets[0], swapped.freeze.presets[1]);
  CHECK(recipe_hash(swapped) == recipe_hash(r));
  Recipe ranked = r;
  ranked.lora.targets[0].rank = 8;
  CHECK(recipe_hash(ranked) != recipe_hash(r));
  Recipe scaled = r;
  scaled.lora.targets[1].alpha = 1.0;
  CHECK(recipe_hash(scaled) != recipe_hash(r));
  CHECK(recipe_hash(r) != recipe_hash(Recipe{}));

  // The differences name the keys, the presets as sets.
  Recipe vision_only;
  vision_only.freeze.presets = {FreezePreset::kFreezeVisionEncoder};
  CHECK(recipe_differences(Recipe{}, vision_only) ==
        std::vector<std::string>{"freeze.presets: added \"freeze_vision_encoder\""});
  Recipe lora_a, lora_b;
  lora_a.lora.targets = {{{"action_out_proj"}, 16, 16.0}};
  lora_b.lora.targets = {{{"action_out_proj"}, 32, 16.0}};
  CHECK(recipe_differences(lora_a, lora_b) == std::vector<std::string>{"lora.targets[0].rank: 16 vs 32"});
  CHECK(recipe_differences(Recipe{}, lora_a) == std::vector<std::string>{"lora.targets: 0 vs 1 entries"});
}

TEST_CASE("Bad freeze and lora values are rejected at their JSON path", "[formats][recipe]") {
  auto check = [](const std::string& text, const std::string& path, const std::string& part) {
    const FormatError e = error_of(text);
    CHECK(e.json_path() == path);
    CHECK_THAT(e.what(), Catch::Contains(part) && Catch::Contains("recipe.json"));
  };
  check(R"({"freeze": {"presets": ["freeze_vision"]}})", "$.freeze.presets[0]",
        R"(expected one of "freeze_vision_encoder", "train_expert_only")");
  check(R"({"freeze": {"presets": ["train_expert_only", "train_expert_only"]}})", "$.freeze.presets[1]",
        "duplicate preset");
  check(R"({"freeze": {"presets": "train_expert_only"}})", "$.freeze.presets", "expected an array");
  check(R"({"freeze": {"modules": ["a..b"]}})", "$.freeze.modules[0]", "empty segment");
  check(R"({"freeze": {"module": []}})", "$.freeze.module", "unknown key");
  check(R"({"lora": {"preset": "peft"}})", "$.lora.preset", R"(expected one of "openpi")");
  check(R"({"lora": {"targets": [{"modules": ["a"], "rank": 0}]}})", "$.lora.targets[0].rank", "1..1048576");
  check(R"({"lora": {"targets": [{"modules": ["a"], "rank": 2.5}]}})", "$.lora.targets[0].rank", "integer");
  check(R"({"lora": {"targets": [{"modules": ["a"], "alpha": 0}]}})", "$.lora.targets[0].alpha", "> 0");
  check(R"({"lora": {"targets": [{"modules": ["a"], "alpha": -1}]}})", "$.lora.targets[0].alpha", "finite number");
  check(R"({"lora": {"targets": [{"modules": ["a"], "alpha": "16"}]}})", "$.lora.targets[0].alpha", "number");
  check(R"({"lora": {"targets": [{"modules": []}]}})", "$.lora.targets[0].modules", "at least one module pattern");
  check(R"({"lora": {"targets": [{"rank": 4}]}})", "$.lora.targets[0].modules", "missing");
  check(R"({"lora": {"targets": [{"modules": ["a.*b"]}]}})", "$.lora.targets[0].modules[0]", "'*'");
  check(R"({"lora": {"targets": [{"modules": ["a"], "dropout": 0.1}]}})", "$.lora.targets[0].dropout", "unknown key");
}
