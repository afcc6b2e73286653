// The standing fuzz test of the torch-free readers (recipe.json, profile.json, run.json, metrics.jsonl, a run
// directory's train_config.json and a checkpoint's state.json): thousands of
// seeded mutations of valid documents (tests/core/fuzz_mutator.h). Every input must be either accepted or refused
// with a FormatError; a crash, a hang or any other exception fails the test (scripts/test.sh runs this tier under
// ASan + UBSan too). What a reader accepts must also survive what comes next: writing it back (the writers validate
// as the readers do), `vlatune check` on it and `vlatune report` of it.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "formats/checkpoint_state.h"
#include "formats/json_error.h"
#include "formats/json_io.h"
#include "formats/metrics_jsonl.h"
#include "formats/profile.h"
#include "formats/recipe.h"
#include "formats/run_record.h"
#include "formats/train_config.h"
#include "fuzz_mutator.h"
#include "reports/check.h"
#include "reports/report.h"
#include "sample_profile.h"

using namespace vlatune::formats;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
// Per reader; the four run in about a second here, a few seconds under the sanitizers.
constexpr int kIterations = 2000;

Recipe full_recipe() {
  Recipe r;
  r.batch.micro_batch = 64;
  r.batch.grad_accum = 2;
  r.data.num_images = 2;
  r.model_options.precision = Precision::kFp32Master;
  r.recompute.modules = {"paligemma_with_expert.paligemma.model.language_model.layers.*.mlp"};
  r.fp8.scaling = Fp8Scaling::kDelayed;
  r.fp8.modules = {"paligemma_with_expert.gemma_expert.model.layers.*.mlp.gate_proj", "action_out_proj"};
  r.groups = {{"vision", {"paligemma_with_expert.paligemma.model.vision_tower"}, true},
              {"layer.0", {"a.layers.0", "b.layers.0"}, false}};
  r.distributed.world_size = 2;
  r.tuned_on.gpu = "NVIDIA H200";
  r.predicted.step_ms = 812.25;
  r.predicted.peak_gib = 101.5;
  r.rationale = {{"candidate: as is", "fits", {{"predicted_step_ms", 812.0}, {"predicted_peak_gib", 100.0}}},
                 {"micro_batch 64", "fits with 18 GiB to spare", {{"chosen", 1}, {"budget_gib", 130}}}};
  return r;
}

RunRecord sample_run(bool gpu) {
  RunRecord r;
  r.steps = 14;
  r.warmup_steps = 2;
  r.skipped_steps = 1;
  r.batch = 32;
  r.seed = 7;
  r.data = "synthetic";
  for (int i = 0; i < 12; ++i) {
    r.step_ms.push_back(800 + i);
    r.loss.push_back(i == 3 ? kNaN : 1.0 / (1 + i));
    r.grad_norm.push_back(1.0 + 0.1 * i);
  }
  r.samples_per_s_median = 39.4;
  if (gpu) {
    r.peak_gib = 71.3;
    r.environment.gpu = "NVIDIA H200";
    r.environment.driver = "580.95.05";
    r.environment.cuda = "13.0";
  }
  r.environment.torch = "2.11.0+cu130";
  r.environment.config = "full";
  r.environment.recipe_hash = recipe_hash(Recipe{});
  return r;
}

std::string metrics_seed(int rows) {
  std::string text = "{\"schema\":\"vlatune.metrics/1\"}\n";
  for (int i = 0; i < rows; ++i) {
    MetricsRow row;
    row.step = i;
    row.loss = i == 1 ? kNaN : 0.5 / (1 + i);
    row.grad_norm = 1.0;
    row.lr = 2.5e-5;
    row.samples_per_s = 40;
    row.step_ms = 800;
    row.data_wait_ms = 0.4;
    row.peak_gib = i % 2 ? kNaN : 70.0;
    row.skipped = i == 1;
    text += metrics_row_to_line(row) + "\n";
  }
  return text;
}

// The current schema: training rows with held-out evaluation rows after steps 1 and 3.
std::string metrics_seed_with_eval() {
  std::string text = "{\"schema\":\"" + std::string(kMetricsSchema) + "\"}\n";
  const std::string v1 = metrics_seed(4);
  std::vector<std::string> rows;
  for (size_t at = v1.find('\n') + 1; at < v1.size(); at = v1.find('\n', at) + 1)
    rows.push_back(v1.substr(at, v1.find('\n', at) - at));
  for (size_t i = 0; i < rows.size(); ++i) {
    text += rows[i] + "\n";
    if (i % 2 == 1) {
      EvalRow e;
      e.step = static_cast<int64_t>(i);
      e.loss = 0.3;
      e.action_mae = i == 3 ? kNaN : 0.02;
      e.action_rmse = 0.03;
      e.action_mae_per_dim = {0.01, 0.03};
      e.action_rmse_per_dim = {0.02, kNaN};
      e.samples = 16;
      e.batches = 2;
      e.eval_ms = 120;
      text += eval_row_to_json(e).dump() + "\n";
    }
  }
  return text;
}

// Feeds `iterations` mutations of `seeds` to `read`; any exception but a FormatError fails, naming the iteration
// and the input.
void fuzz(const std::vector<std::string>& seeds, uint64_t seed, int iterations,
          const std::function<void(const std::string&)>& read) {
  vlatune::test::Mutator mutator(seed);
  int accepted = 0, refused = 0;
  for (int i = 0; i < iterations; ++i) {
    const std::string input = mutator.mutate(seeds);
    try {
      read(input);
      ++accepted;
    } catch (const FormatError&) {
      ++refused;
    } catch (const std::exception& e) {
      FAIL("iteration " << i << " (seed " << seed << "): " << e.what()
                        << "\ninput (first 400 bytes): " << input.substr(0, 400));
    }
  }
  INFO("accepted " << accepted << ", refused " << refused);
  CHECK(refused > 0);  // the mutations do reach the validation
  for (const auto& s : seeds) CHECK_NOTHROW(read(s));
}

}  // namespace

TEST_CASE("Fuzz: every mutated recipe.json is accepted or refused with a FormatError", "[formats][fuzz]") {
  const std::vector<std::string> seeds = {dump_json_file(recipe_to_json(full_recipe())),
                                          dump_json_file(recipe_to_json(Recipe{})), "{}"};
  fuzz(seeds, 1, kIterations, [](const std::string& text) {
    const Recipe r = parse_recipe(parse_json_text(text, "recipe.json"), "recipe.json");
    // Accepted: it writes back (the writer validates as the reader does) and reads back the same.
    const nlohmann::json j = recipe_to_json(r);
    if (parse_recipe(parse_json_text(dump_json_file(j), "again.json"), "again.json") != r)
      throw std::logic_error("recipe does not read back equal");
    // The keys `check` names for a recipe_hash difference: none exactly when the hashes agree.
    if (recipe_differences(r, full_recipe()).empty() != (recipe_hash(r) == recipe_hash(full_recipe())))
      throw std::logic_error("recipe_differences disagrees with recipe_hash");
    vlatune::reports::ReportInput in;
    in.recipe = r;
    vlatune::reports::render_report(in);
  });
}

TEST_CASE("Fuzz: every mutated run.json is accepted or refused with a FormatError; check and report take it",
          "[formats][fuzz]") {
  const std::vector<std::string> seeds = {dump_json_file(run_record_to_json(sample_run(true))),
                                          dump_json_file(run_record_to_json(sample_run(false)))};
  const RunRecord baseline = sample_run(true);
  fuzz(seeds, 2, kIterations, [&](const std::string& text) {
    const RunRecord r = parse_run_record(parse_json_text(text, "run.json"), "run.json");
    if (!(parse_run_record(run_record_to_json(r), "again.json") == r))
      throw std::logic_error("run record does not read back equal");
    const auto b = vlatune::reports::subject_from_run(baseline, "base.json");
    const auto c = vlatune::reports::subject_from_run(r, "run.json");
    for (bool numerics : {false, true}) {
      vlatune::reports::CheckOptions o;
      o.numerics_only = numerics;
      const auto result = vlatune::reports::check(b, c, o);
      vlatune::reports::format_check(result, o);
      vlatune::reports::format_check(vlatune::reports::check(c, b, o), o);
    }
    vlatune::reports::ReportInput in;
    in.runs.push_back({"run", "run.json", r, {}, std::nullopt});
    vlatune::reports::render_report(in);
  });
}

TEST_CASE("Fuzz: every mutated profile.json is accepted or refused with a FormatError; check and report take it",
          "[formats][fuzz]") {
  const Profile p = vlatune::test::sample_profile();
  Profile with_comm = p;
  with_comm.environment.world_size = 2;
  with_comm.communication = Communication{2, 150.0, 3.5, {{"vision", 1 << 20, 1.5}}};
  const std::vector<std::string> seeds = {dump_json_file(profile_to_json(p)), profile_to_json(with_comm).dump()};
  fuzz(seeds, 3, kIterations / 2, [&](const std::string& text) {
    const Profile got = parse_profile(parse_json_text(text, "profile.json"), "profile.json");
    if (profile_to_json(parse_profile(profile_to_json(got), "again.json")) != profile_to_json(got))
      throw std::logic_error("profile does not read back equal");
    const auto s = vlatune::reports::subject_from_profile(got, "profile.json");
    const auto b = vlatune::reports::subject_from_profile(p, "base.json");
    vlatune::reports::format_check(vlatune::reports::check(b, s, {}), {});
    vlatune::reports::ReportInput in;
    in.profile = got;
    in.profile_file = "profile.json";
    in.recipe = got.recipe;
    vlatune::reports::render_report(in);
  });
}

TEST_CASE("Fuzz: every mutated metrics.jsonl is accepted or refused with a FormatError", "[formats][fuzz]") {
  const std::vector<std::string> seeds = {metrics_seed(6), metrics_seed(0), metrics_seed(2), metrics_seed_with_eval()};
  fuzz(seeds, 4, kIterations, [](const std::string& text) {
    const MetricsLog log = parse_metrics_log(text, "metrics.jsonl");
    for (const auto& row : log.train) {
      if (!(parse_metrics_row(metrics_row_to_json(row), "again:1") == row))
        throw std::logic_error("metrics row does not read back equal");
    }
    for (const auto& row : log.eval) {
      if (!(parse_eval_row(eval_row_to_json(row), "again:1") == row))
        throw std::logic_error("evaluation row does not read back equal");
    }
    vlatune::reports::ReportInput in;
    in.runs.push_back({"run", "run.json", sample_run(true), log.train, std::nullopt, log.eval});
    vlatune::reports::render_report(in);
  });
}

TEST_CASE("Fuzz: every mutated train_config.json and checkpoint state.json is accepted or refused with a FormatError",
          "[formats][fuzz]") {
  const std::string config = R"({"schema": "vlatune.train_config/2", "run_id": "0123456789abcdef", "config": "tiny",
    "data": "/data/libero", "recipe_source": "/home/u/recipe.json", "init_weights": null, "device": "cpu",
    "steps": 100, "lr": 5e-05, "warmup_steps": 10, "decay_steps": 1000, "decay_lr": 5e-05, "clip_norm": 1.0,
    "weight_decay": 1e-10, "beta1": 0.9, "beta2": 0.95, "eps": 1e-08, "ema_decay": 0.999, "loss_action_dim": 7,
    "seed": 18446744073709551615, "timing_warmup": 3, "checkpoint_every": 10, "keep_last": 3,
    "max_consecutive_nonfinite": 10, "workers": 4, "augment": true, "save": true, "world_size": 2,
    "dist_buckets": "groups"})";
  fuzz({config}, 5, kIterations, [](const std::string& text) {
    const TrainConfig c = parse_train_config(parse_json_text(text, "train_config.json"), "train_config.json");
    if (!(parse_train_config(train_config_to_json(c), "again.json") == c))
      throw std::logic_error("train config does not read back equal");
  });
  const std::string state = R"({"schema": "vlatune.checkpoint/2", "run_id": "0123456789abcdef", "next_step": 20,
    "optimizer": {"precision": "bf16", "scalars": {"step": 20, "skipped_steps": 1, "beta1": 0.9}}, "ema": true,
    "trainer": {"skipped_steps": 1, "data_fingerprint": "synthetic", "seed": 42, "lr_next": 5e-05},
    "files": {"model.safetensors": "xxh64:00112233445566aa", "optimizer.safetensors": "xxh64:0123456789abcdef",
              "ema.safetensors": "xxh64:fedcba9876543210"}})";
  CheckpointExpectations expected;
  expected.run_id = "0123456789abcdef";
  expected.max_next_step = 100;
  expected.seed = 42;
  expected.optimizer_precision = "bf16";
  expected.ema = true;
  fuzz({state}, 6, kIterations, [&](const std::string& text) {
    const CheckpointState s = parse_checkpoint_state(parse_json_text(text, "state.json"), "state.json");
    if (!(parse_checkpoint_state(checkpoint_state_to_json(s), "again.json") == s))
      throw std::logic_error("checkpoint state does not read back equal");
    check_checkpoint_state(s, "state.json", expected);
  });
}
