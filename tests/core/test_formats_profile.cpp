// profile.json reader/writer: round trip, strict validation with file + JSON path (the tuner trusts what it reads).
#include <catch2/catch.hpp>

#include "temp_dir.h"

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "formats/json_error.h"
#include "formats/profile.h"
#include "sample_profile.h"

using namespace vlatune::formats;
using nlohmann::json;

using vlatune::test::sample_profile;
using vlatune::test::TempDir;

namespace {

FormatError error_of(const json& j) {
  try {
    parse_profile(j, "profile.json");
  } catch (const FormatError& e) {
    return e;
  }
  FAIL("accepted: " << j.dump());
  throw;  // unreachable
}

}  // namespace

TEST_CASE("profile.json round-trips through the writer and the reader", "[formats][profile]") {
  TempDir dir("profile");
  const Profile p = sample_profile();
  const std::string path = dir.file("profile.json");
  write_profile(p, path);
  const Profile back = read_profile(path);
  CHECK(profile_to_json(back) == profile_to_json(p));
  REQUIRE(back.batches.size() == 2);
  CHECK(back.batches[0].modules[1].activation_bytes == int64_t{1} << 29);
  CHECK(back.gemms[0].members.size() == 3);
  CHECK_FALSE(back.gemms[1].fp8.has_value());
  CHECK(back.overhead->fraction() == Approx(712.0 / 700.0 - 1));
  CHECK(back.recipe.recompute.modules == p.recipe.recompute.modules);
  REQUIRE(back.batches[0].kernels[0].sites.size() == 2);
  CHECK(back.batches[0].kernels[0].sites[0].phase == "backward");
  CHECK(back.batches[0].kernels[0].sites[1].ms == 150.0);
  // Profiles written before kernel sites existed have none: still read.
  json old = profile_to_json(p);
  for (auto& k : old["batches"][0]["kernels"]) k.erase("sites");
  CHECK(parse_profile(old, "old.json").batches[0].kernels[0].sites.empty());
}

TEST_CASE("profile.json's data wait round-trips and is optional (absent: not measured)", "[formats][profile]") {
  TempDir dir("profile");
  Profile p = sample_profile();
  p.batches[1].data_wait_ms = 0.0;  // synthetic data: a measured zero, kept as such
  p.batches[1].data_wait_ms_samples = {0.0, 0.0, 0.0};
  const std::string path = dir.file("profile.json");
  write_profile(p, path);
  const Profile back = read_profile(path);
  CHECK(profile_to_json(back) == profile_to_json(p));
  REQUIRE(back.batches[0].data_wait_ms.has_value());
  CHECK(*back.batches[0].data_wait_ms == 0.4);
  CHECK(back.batches[0].data_wait_ms_samples == std::vector<double>{0.3, 0.4, 1.5});
  REQUIRE(back.batches[1].data_wait_ms.has_value());
  CHECK(*back.batches[1].data_wait_ms == 0.0);

  // Not measured: written without the keys (not as 0 or null), and profiles written before them still read.
  p.batches[0].data_wait_ms.reset();
  p.batches[0].data_wait_ms_samples.clear();
  const json unmeasured = profile_to_json(p);
  CHECK_FALSE(unmeasured["batches"][0].contains("data_wait_ms"));
  CHECK_FALSE(unmeasured["batches"][0].contains("data_wait_ms_samples"));
  const Profile old = parse_profile(unmeasured, "old.json");
  CHECK_FALSE(old.batches[0].data_wait_ms.has_value());
  CHECK(old.batches[0].data_wait_ms_samples.empty());
  CHECK(old.batches[1].data_wait_ms.has_value());
}

TEST_CASE("profile.json's workload and compute capability round-trip and are optional on read", "[formats][profile]") {
  TempDir dir("profile");
  Profile p = sample_profile();
  p.settings.workload = "inference";
  p.settings.compute_capability = ComputeCapability{8, 9};
  const std::string path = dir.file("profile.json");
  write_profile(p, path);
  const Profile back = read_profile(path);
  CHECK(back.settings.workload == "inference");
  REQUIRE(back.settings.compute_capability);
  CHECK(*back.settings.compute_capability == ComputeCapability{8, 9});
  CHECK(profile_to_json(back)["settings"]["compute_capability"] == "8.9");
  CHECK(back.settings.compute_capability->at_least(8, 9));
  CHECK_FALSE(ComputeCapability{8, 6}.at_least(8, 9));
  CHECK(ComputeCapability{9, 0}.at_least(8, 9));
  // A CPU profile has no capability (null); profiles written before the fields are training profiles.
  p.settings.compute_capability.reset();
  CHECK(profile_to_json(p)["settings"]["compute_capability"].is_null());
  json old = profile_to_json(p);
  old["settings"].erase("workload");
  old["settings"].erase("compute_capability");
  const Profile older = parse_profile(old, "old.json");
  CHECK(older.settings.workload == "train");
  CHECK_FALSE(older.settings.compute_capability);

  const json good = profile_to_json(sample_profile());
  for (const auto& [value, reason] : std::vector<std::pair<json, std::string>>{{"8", "major.minor"},
                                                                               {"8.9.1", "major.minor"},
                                                                               {" 8.9", "major.minor"},
                                                                               {"0.9", "major.minor"},
                                                                               {89, "string"}}) {
    json j = good;
    j["settings"]["compute_capability"] = value;
    const FormatError e = error_of(j);
    CHECK(e.json_path() == "$.settings.compute_capability");
    CHECK_THAT(e.reason(), Catch::Contains(reason));
  }
  json bad = good;
  bad["settings"]["workload"] = "serve";
  CHECK(error_of(bad).json_path() == "$.settings.workload");
}

TEST_CASE("profile.json reader rejects a bad data wait with the JSON path", "[formats][profile]") {
  const json good = profile_to_json(sample_profile());
  auto with = [&](const json::json_pointer& ptr, const json& value) {
    json j = good;
    j[ptr] = value;
    return j;
  };
  auto without = [&](const char* key) {
    json j = good;
    j["batches"][0].erase(key);
    return j;
  };
  struct Case {
    json doc;
    std::string path;
    std::string reason_part;
  };
  const std::vector<Case> cases = {
      {with("/batches/0/data_wait_ms"_json_pointer, -0.5), "$.batches[0].data_wait_ms", ">= 0"},
      {with("/batches/0/data_wait_ms"_json_pointer, "NaN"), "$.batches[0].data_wait_ms", "finite number"},
      {with("/batches/0/data_wait_ms"_json_pointer, std::nan("")), "$.batches[0].data_wait_ms", "finite number"},
      {with("/batches/0/data_wait_ms"_json_pointer, nullptr), "$.batches[0].data_wait_ms", "finite number"},
      {with("/batches/0/data_wait_ms"_json_pointer, json::array({0.4})), "$.batches[0].data_wait_ms", "finite number"},
      {with("/batches/1/data_wait_ms_samples/2"_json_pointer, -1.0), "$.batches[1].data_wait_ms_samples[2]", ">= 0"},
      {with("/batches/0/data_wait_ms_samples/0"_json_pointer, "Infinity"), "$.batches[0].data_wait_ms_samples[0]",
       "finite number"},
      {with("/batches/0/data_wait_ms_samples"_json_pointer, 0.4), "$.batches[0].data_wait_ms_samples", "array"},
      {with("/batches/0/data_wait_ms_samples"_json_pointer, json::array({0.3, 0.4})),
       "$.batches[0].data_wait_ms_samples", "expected 3 entries (one per step_ms_samples entry"},
      {with("/batches/0/data_wait_ms_samples"_json_pointer, json::array()), "$.batches[0].data_wait_ms_samples",
       "got 0"},
      {without("data_wait_ms_samples"), "$.batches[0].data_wait_ms_samples", "missing required key"},
      {without("data_wait_ms"), "$.batches[0].data_wait_ms", "missing required key"},
  };
  for (const auto& c : cases) {
    INFO("expected error at " << c.path);
    const FormatError e = error_of(c.doc);
    CHECK(e.file() == "profile.json");
    CHECK(e.json_path() == c.path);
    CHECK_THAT(e.reason(), Catch::Contains(c.reason_part));
  }

  // The writer validates as the reader does: samples that do not match the timed steps are not written.
  TempDir dir("profile");
  Profile p = sample_profile();
  p.batches[0].data_wait_ms_samples.pop_back();
  CHECK_THROWS_AS(write_profile(p, dir.file("profile.json")), FormatError);
}

TEST_CASE("profile.json reader rejects bad input with the JSON path", "[formats][profile]") {
  const json good = profile_to_json(sample_profile());
  REQUIRE_NOTHROW(parse_profile(good, "profile.json"));

  auto with = [&](const json::json_pointer& ptr, const json& value) {
    json j = good;
    j[ptr] = value;
    return j;
  };
  struct Case {
    json doc;
    std::string path;
    std::string reason_part;
  };
  json no_batches = good;
  no_batches["batches"] = json::array();
  json dup_module = good;
  dup_module["batches"][0]["modules"][1]["fqn"] = dup_module["batches"][0]["modules"][0]["fqn"];
  json small_first = good;
  std::swap(small_first["batches"][0], small_first["batches"][1]);
  json dup_batch = good;
  dup_batch["batches"][1]["batch"] = 32;
  json extra = good;
  extra["gemms"][0]["bogus"] = 1;
  const std::vector<Case> cases = {
      {with("/schema"_json_pointer, "vlatune.profile/2"), "$.schema", "vlatune.profile/1"},
      {no_batches, "$.batches", "at least one"},
      {dup_module, "$.batches[0].modules[1].fqn", "listed twice"},
      {small_first, "$.batches[1].batch", "larger than batches[0]"},
      {dup_batch, "$.batches[1].batch", "profiled twice"},
      {extra, "$.gemms[0].bogus", "unknown key"},
      {with("/batches/0/step_ms"_json_pointer, 0.0), "$.batches[0].step_ms", "> 0"},
      {with("/batches/0/step_ms_samples"_json_pointer, json::array()), "$.batches[0].step_ms_samples", "at least one"},
      {with("/batches/0/attribution/attributed_fraction"_json_pointer, 1.5),
       "$.batches[0].attribution.attributed_fraction", "0..1"},
      {with("/batches/0/kernels/0/category"_json_pointer, "matmul"), "$.batches[0].kernels[0].category", "gemm"},
      {with("/batches/0/kernels/0/sites/1/phase"_json_pointer, "warmup"), "$.batches[0].kernels[0].sites[1].phase",
       "forward, backward"},
      {with("/batches/0/kernels/0/sites/0/module"_json_pointer, ""), "$.batches[0].kernels[0].sites[0].module",
       "non-empty"},
      {with("/batches/0/kernels/0/sites"_json_pointer,
            json::array({good["batches"][0]["kernels"][0]["sites"][0], good["batches"][0]["kernels"][0]["sites"][0],
                         good["batches"][0]["kernels"][0]["sites"][0], good["batches"][0]["kernels"][0]["sites"][0],
                         good["batches"][0]["kernels"][0]["sites"][0], good["batches"][0]["kernels"][0]["sites"][0],
                         good["batches"][0]["kernels"][0]["sites"][0], good["batches"][0]["kernels"][0]["sites"][0],
                         good["batches"][0]["kernels"][0]["sites"][0]})),
       "$.batches[0].kernels[0].sites", "at most 8 sites"},
      {with("/batches/0/kernels/0/sites/0/ms"_json_pointer, -1.0), "$.batches[0].kernels[0].sites[0].ms", ">= 0"},
      {with("/batches/0/modules/0/activation_bytes"_json_pointer, -1), "$.batches[0].modules[0].activation_bytes",
       ">= 0"},
      {with("/gemms/0/m"_json_pointer, 0), "$.gemms[0].m", ">= 1"},
      {with("/recomputable/1"_json_pointer, ""), "$.recomputable[1]", "non-empty"},
      {with("/gemms/0/members"_json_pointer, json::array()), "$.gemms[0].members", "non-empty"},
      {with("/settings/tracer"_json_pointer, "nsys"), "$.settings.tracer", "cupti"},
      {with("/recipe/batch/micro_batch"_json_pointer, 0), "$.recipe.batch.micro_batch", "1"},
      {with("/environment/recipe_hash"_json_pointer, "xyz"), "$.environment.recipe_hash", "16 lowercase hex"},
      {with("/batches/0/recompute/0/patterns"_json_pointer, json::array()), "$.batches[0].recompute[0].patterns",
       "non-empty"},
  };
  for (const auto& c : cases) {
    INFO("expected error at " << c.path);
    const FormatError e = error_of(c.doc);
    CHECK(e.file() == "profile.json");
    CHECK(e.json_path() == c.path);
    CHECK_THAT(e.reason(), Catch::Contains(c.reason_part));
  }
}

TEST_CASE("read_profile names the file when it is missing or not JSON", "[formats][profile]") {
  TempDir dir("profile");
  CHECK_THROWS_WITH(read_profile(dir.file("absent.json")), Catch::Contains("absent.json"));
}

TEST_CASE("profile.json's communication section round-trips and bad values are rejected", "[formats][profile]") {
  TempDir dir("profile");
  Profile p = sample_profile();
  Communication c;
  c.world_size = 2;
  c.allreduce_gbps = 312.5;
  c.exposed_ms = 1.25;
  c.groups = {{"heads.out", 1 << 20, 0.05}, {"layer.17", 218103808, 1.4}, {"<rest>", 0, 0.0}};
  p.communication = c;
  const std::string path = dir.file("profile.json");
  write_profile(p, path);
  const Profile back = read_profile(path);
  CHECK(profile_to_json(back) == profile_to_json(p));
  REQUIRE(back.communication.has_value());
  CHECK(back.communication->world_size == 2);
  CHECK(back.communication->allreduce_gbps == 312.5);
  CHECK(back.communication->exposed_ms == 1.25);
  REQUIRE(back.communication->groups.size() == 3);
  CHECK(back.communication->groups[1].name == "layer.17");
  CHECK(back.communication->groups[1].bytes == 218103808);
  CHECK(back.communication->groups[1].allreduce_ms == 1.4);

  // A single-GPU profile has none (null), and reads back without it.
  p.communication.reset();
  const json single = profile_to_json(p);
  CHECK(single["communication"].is_null());
  CHECK_FALSE(parse_profile(single, "profile.json").communication.has_value());

  p.communication = c;
  const json good = profile_to_json(p);
  auto with = [&](const json::json_pointer& ptr, const json& value) {
    json j = good;
    j[ptr] = value;
    return j;
  };
  json extra = good;
  extra["communication"]["groups"][0]["bogus"] = 1;
  json missing = good;
  missing["communication"].erase("exposed_ms");
  struct Case {
    json doc;
    std::string path;
    std::string reason_part;
  };
  const std::vector<Case> cases = {
      {with("/communication/world_size"_json_pointer, 1), "$.communication.world_size", "in 2.."},
      {with("/communication/allreduce_gbps"_json_pointer, -1.0), "$.communication.allreduce_gbps", ">= 0"},
      {with("/communication/allreduce_gbps"_json_pointer, "fast"), "$.communication.allreduce_gbps", "number"},
      {with("/communication/exposed_ms"_json_pointer, -0.5), "$.communication.exposed_ms", ">= 0"},
      {with("/communication/groups/0/name"_json_pointer, ""), "$.communication.groups[0].name", "non-empty"},
      {with("/communication/groups/1/bytes"_json_pointer, -8), "$.communication.groups[1].bytes", ">= 0"},
      {with("/communication/groups/1/allreduce_ms"_json_pointer, -1.0), "$.communication.groups[1].allreduce_ms",
       ">= 0"},
      {with("/communication/groups"_json_pointer, json::object()), "$.communication.groups", "array"},
      {extra, "$.communication.groups[0].bogus", "unknown key"},
      {missing, "$.communication.exposed_ms", ""},
  };
  for (const auto& cs : cases) {
    INFO("expected error at " << cs.path);
    const FormatError e = error_of(cs.doc);
    CHECK(e.json_path() == cs.path);
    CHECK_THAT(e.reason(), Catch::Contains(cs.reason_part));
  }
}
