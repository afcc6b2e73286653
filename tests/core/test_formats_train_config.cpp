// train_config.json and a checkpoint's state.json: round trips, and every bad value refused with the file and the
// JSON path (they decide what a resumed run does, so nothing in them is taken on trust).
#include <catch2/catch.hpp>

#include "temp_dir.h"

#include <cstdint>
#include <limits>
#include <string>

#include "formats/checkpoint_state.h"
#include "formats/json_error.h"
#include "formats/train_config.h"

using namespace vlatune::formats;
using nlohmann::json;
using vlatune::test::TempDir;

namespace {

TrainConfig sample_config() {
  TrainConfig c;
  c.run_id = "0123456789abcdef";
  c.config = "tiny";
  c.data = "/data/libero";
  c.recipe_source = "/home/u/recipe.json";
  c.device = "cpu";
  c.steps = 100;
  c.lr = 5e-5;
  c.warmup_steps = 10;
  c.decay_steps = 1000;
  c.decay_lr = 5e-5;
  c.clip_norm = 1.0;
  c.weight_decay = 1e-10;
  c.beta1 = 0.9;
  c.beta2 = 0.95;
  c.eps = 1e-8;
  c.ema_decay = 0.999;
  c.loss_action_dim = 7;
  c.seed = std::numeric_limits<uint64_t>::max();  // seeds are unsigned 64-bit: the top of the range survives
  c.timing_warmup = 3;
  c.checkpoint_every = 10;
  c.keep_last = 3;
  c.max_consecutive_nonfinite = 10;
  c.workers = 4;
  c.augment = true;
  c.save = true;
  c.world_size = 2;
  c.dist_buckets = "groups";
  return c;
}

json config_with(const std::string& pointer, const json& value) {
  json j = train_config_to_json(sample_config());
  j[json::json_pointer(pointer)] = value;
  return j;
}

CheckpointState sample_state() {
  CheckpointState s;
  s.run_id = "0123456789abcdef";
  s.next_step = 20;
  s.optimizer_precision = "bf16";
  s.optimizer_scalars = {{"step", 20}, {"skipped_steps", 1}, {"beta1", 0.9}};
  s.ema = true;
  s.skipped_steps = 1;
  s.data_fingerprint = "synthetic";
  s.seed = 42;
  s.lr_next = 5e-5;
  s.files = {{"model.safetensors", "xxh64:00112233445566aa"},
             {"optimizer.safetensors", "xxh64:0123456789abcdef"},
             {"ema.safetensors", "xxh64:fedcba9876543210"}};
  return s;
}

json state_with(const std::string& pointer, const json& value) {
  json j = checkpoint_state_to_json(sample_state());
  j[json::json_pointer(pointer)] = value;
  return j;
}

template <typename Parse>
FormatError error_of(Parse parse, const json& j) {
  try {
    parse(j);
  } catch (const FormatError& e) {
    return e;
  }
  FAIL("accepted: " << j.dump());
  throw;  // unreachable
}

struct Case {
  json j;
  const char* path;
  const char* reason;
};

}  // namespace

TEST_CASE("A train config round-trips through a file, the largest seed included", "[formats][train_config]") {
  TempDir dir("train_config");
  const std::string path = dir.file("train_config.json");
  TrainConfig c = sample_config();
  write_train_config(c, path);
  CHECK(read_train_config(path) == c);
  c.recipe_source.reset();
  c.init_weights = "/w/pi05_base.safetensors";
  CHECK(parse_train_config(train_config_to_json(c), "t.json") == c);
}

TEST_CASE("Bad train configs are refused with the file and the JSON path", "[formats][train_config]") {
  json missing = train_config_to_json(sample_config());
  missing.erase("lr");
  const Case cases[] = {
      {config_with("/schema", "vlatune.train_config/1"), "$.schema", "another vlatune version"},
      {missing, "$.lr", "missing required key"},
      {config_with("/learning_rate", 0.1), "$.learning_rate", "unknown key"},
      {config_with("/run_id", "xyz"), "$.run_id", "16 lowercase hex digits"},
      {config_with("/config", "huge"), "$.config", "\"tiny\", \"full\""},
      {config_with("/data", ""), "$.data", "non-empty string"},
      {config_with("/steps", 0), "$.steps", "expected an integer in 1.."},
      {config_with("/steps", "100"), "$.steps", "got string \"100\""},
      {config_with("/lr", -1e-4), "$.lr", "expected a finite number >= 0"},
      {config_with("/clip_norm", nullptr), "$.clip_norm", "got null"},
      {config_with("/ema_decay", 1.0), "$.ema_decay", "expected a number in [0.0, 1.0)"},
      {config_with("/beta2", -0.1), "$.beta2", "[0.0, 1.0)"},
      {config_with("/eps", 0.0), "$.eps", "> 0"},
      {config_with("/loss_action_dim", 33), "$.loss_action_dim", "in 1..32"},
      {config_with("/seed", -1), "$.seed", "expected an integer in 0.."},
      {config_with("/seed", 1.5), "$.seed", "got 1.5"},
      {config_with("/keep_last", 0), "$.keep_last", "in 1..1000"},
      {config_with("/workers", 0), "$.workers", "in 1..256"},
      {config_with("/save", 1), "$.save", "true or false"},
      {config_with("/dist_buckets", "two"), "$.dist_buckets", "\"groups\", \"one\""},
      {config_with("/init_weights", 3), "$.init_weights", "non-empty string"},
  };
  for (const Case& c : cases) {
    INFO(c.j.dump());
    const FormatError e = error_of([](const json& j) { parse_train_config(j, "run/train_config.json"); }, c.j);
    CHECK(e.file() == "run/train_config.json");
    CHECK(e.json_path() == c.path);
    CHECK_THAT(e.reason(), Catch::Contains(c.reason));
  }
}

TEST_CASE("Run-directory paths: absolute ones as written, relative ones below the run directory",
          "[formats][train_config]") {
  CHECK(resolve_run_path("/runs/a", "/data/x") == "/data/x");
  CHECK(resolve_run_path("/runs/a", "data/x") == "/runs/a/data/x");
  CHECK(resolve_run_path("/runs/a/", "data") == "/runs/a/data");
}

TEST_CASE("A checkpoint state round-trips and names exactly its tensor files", "[formats][checkpoint]") {
  const CheckpointState s = sample_state();
  CHECK(parse_checkpoint_state(checkpoint_state_to_json(s), "state.json") == s);
  CHECK(checkpoint_tensor_files(false) == std::vector<std::string>{"model.safetensors", "optimizer.safetensors"});
  CHECK(checkpoint_tensor_files(true).size() == 3);
}

TEST_CASE("Bad checkpoint states are refused with the file and the JSON path", "[formats][checkpoint]") {
  json no_ema_checksum = checkpoint_state_to_json(sample_state());
  no_ema_checksum["files"].erase("ema.safetensors");
  const Case cases[] = {
      {state_with("/schema", "vlatune.checkpoint/1"), "$.schema", "expected \"vlatune.checkpoint/2\""},
      {state_with("/extra", true), "$.extra", "unknown key"},
      {state_with("/next_step", -3), "$.next_step", "expected an integer in 0.."},
      {state_with("/trainer/skipped_steps", 21), "$.trainer.skipped_steps", "in 0..20"},
      {state_with("/trainer/lr_next", -1.0), "$.trainer.lr_next", ">= 0"},
      {state_with("/trainer/data_fingerprint", ""), "$.trainer.data_fingerprint", "non-empty"},
      {state_with("/trainer/seed", -1), "$.trainer.seed", "integer >= 0"},
      {state_with("/optimizer/precision", "fp16"), "$.optimizer.precision", "\"bf16\", \"fp32-master\""},
      {state_with("/optimizer/scalars/step", 21), "$.optimizer.scalars.step", "0..next_step (20)"},
      {state_with("/optimizer/scalars/step", 2.5), "$.optimizer.scalars.step", "whole number"},
      {state_with("/optimizer/scalars/eps", "small"), "$.optimizer.scalars.eps", "finite number"},
      // A name outside the checkpoint is never accepted (pruning removes the files state.json names).
      {state_with("/files/..~1..~1model.safetensors", "xxh64:0123456789abcdef"), "$.files.../../model.safetensors",
       "not a file of this checkpoint"},
      {state_with("/files/model.safetensors", "crc32:1234"), "$.files.model.safetensors", "\"xxh64:\""},
      {no_ema_checksum, "$.files", "missing the checksum of ema.safetensors"},
  };
  for (const Case& c : cases) {
    INFO(c.j.dump());
    const FormatError e = error_of([](const json& j) { parse_checkpoint_state(j, "step_00000020/state.json"); }, c.j);
    CHECK(e.file() == "step_00000020/state.json");
    CHECK(e.json_path() == c.path);
    CHECK_THAT(e.reason(), Catch::Contains(c.reason));
  }
}

TEST_CASE("A checkpoint state is checked against the run that resumes from it", "[formats][checkpoint]") {
  const CheckpointState s = sample_state();
  CheckpointExpectations expected{"0123456789abcdef", 100, 42, "bf16", true};
  CHECK_NOTHROW(check_checkpoint_state(s, "state.json", expected));
  auto path_of = [&s](const CheckpointExpectations& e) {
    try {
      check_checkpoint_state(s, "state.json", e);
    } catch (const FormatError& error) {
      return error.json_path();
    }
    return std::string("accepted");
  };
  CheckpointExpectations other = expected;
  other.run_id = "ffffffffffffffff";
  CHECK(path_of(other) == "$.run_id");
  other = expected;
  other.max_next_step = 19;
  CHECK(path_of(other) == "$.next_step");
  other = expected;
  other.seed = 43;
  CHECK(path_of(other) == "$.trainer.seed");
  other = expected;
  other.optimizer_precision = "fp32-master";
  CHECK(path_of(other) == "$.optimizer.precision");
  other = expected;
  other.ema = false;
  CHECK(path_of(other) == "$.ema");
}
