// The trainer end to end on the tiny config (CPU): resume is bit-exact, outputs are valid, recipes are applied
// or refused with the JSON path.
#include <c10/cuda/CUDAFunctions.h>
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "formats/json_error.h"
#include "formats/metrics_jsonl.h"
#include "formats/recipe.h"
#include "formats/run_record.h"
#include "model/safetensors_io.h"
#include "temp_dir.h"
#include "tiny_train_options.h"
#include "trainer/checkpoint.h"
#include "trainer/synthetic.h"
#include "trainer/train_loop.h"
#include "trainer/train_step.h"

namespace {

using vlatune::trainer::TrainOptions;

std::string fresh_dir(const std::string& tag) {
  return vlatune::test::make_temp_dir("train") + "/" + tag;
}

// A decaying schedule and an EMA, so resume must restore both.
TrainOptions tiny_options(const std::string& out, int64_t steps) {
  TrainOptions o = vlatune::test::tiny_train_options(out, steps);
  o.decay_steps = 100;
  o.decay_lr = 1e-4;
  o.ema_decay = 0.9;
  return o;
}

std::map<std::string, torch::Tensor> load_all(const std::string& path) {
  auto f = vlatune::model::SafetensorsFile::open(path);
  std::map<std::string, torch::Tensor> out;
  for (const auto& e : f.entries()) out[e.name] = f.tensor(e.name);
  return out;
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
}

}  // namespace

TEST_CASE("A resumed run ends bit-identical to a straight run", "[train]") {
  std::ostringstream log;
  const std::string straight = fresh_dir("straight"), resumed = fresh_dir("resumed");
  auto s = vlatune::trainer::run_training(tiny_options(straight, 4), log);
  CHECK(s.last_step == 4);

  auto first = tiny_options(resumed, 2);
  vlatune::trainer::run_training(first, log);
  TrainOptions again;
  again.resume = resumed;
  again.steps = 4;
  again.progress_bar = false;
  auto r = vlatune::trainer::run_training(again, log);
  CHECK(r.first_step == 2);
  CHECK(r.last_step == 4);

  for (const char* file : {"final/model.safetensors", "checkpoints/step_00000004/optimizer.safetensors",
                           "checkpoints/step_00000004/ema.safetensors"}) {
    INFO(file);
    auto a = load_all(straight + "/" + file), b = load_all(resumed + "/" + file);
    REQUIRE(a.size() == b.size());
    for (const auto& [name, t] : a) {
      INFO(name);
      REQUIRE(b.count(name) == 1);
      CHECK(torch::equal(t, b[name]));
    }
  }
  // The metrics of the resumed run continue where the first part stopped: one row per step, in order.
  auto rows = vlatune::formats::read_metrics(resumed + "/metrics.jsonl");
  REQUIRE(rows.size() == 4);
  for (int64_t i = 0; i < 4; ++i) CHECK(rows[static_cast<size_t>(i)].step == i);
  auto straight_rows = vlatune::formats::read_metrics(straight + "/metrics.jsonl");
  for (size_t i = 0; i < 4; ++i) CHECK(rows[i].loss == straight_rows[i].loss);
  // run.json covers the whole run, both segments: the same steps, losses and gradient norms as the straight run's.
  const auto a = vlatune::formats::read_run_record(straight + "/run.json");
  const auto b = vlatune::formats::read_run_record(resumed + "/run.json");
  CHECK(b.steps == 4);
  CHECK(b.warmup_steps == a.warmup_steps);
  CHECK(b.step_ms.size() == a.step_ms.size());
  CHECK(b.loss == a.loss);
  CHECK(b.grad_norm == a.grad_norm);
}

TEST_CASE("A run writes metrics, run.json, checkpoints and final weights that read back", "[train]") {
  std::ostringstream log;
  const std::string dir = fresh_dir("outputs");
  auto o = tiny_options(dir, 5);
  o.keep_last = 2;
  vlatune::trainer::run_training(o, log);
  auto run = vlatune::formats::read_run_record(dir + "/run.json");
  CHECK(run.steps == 5);
  CHECK(run.warmup_steps == 1);
  CHECK(run.step_ms.size() == 4);
  CHECK(run.batch == 2);
  CHECK(run.environment.config == "tiny");
  for (double loss : run.loss) CHECK(std::isfinite(loss));
  auto rows = vlatune::formats::read_metrics(dir + "/metrics.jsonl");
  REQUIRE(rows.size() == 5);
  CHECK(rows[0].lr == Approx(1e-3 / 3));  // warmup starts at peak / (W + 1)
  // keep_last 2: checkpoints 4 and 5 remain (2 was pruned).
  auto cks = vlatune::trainer::list_checkpoints(dir);
  REQUIRE(cks.size() == 2);
  CHECK(cks[0].find("step_00000004") != std::string::npos);
  CHECK(cks[1].find("step_00000005") != std::string::npos);
  auto weights = load_all(dir + "/final/model.safetensors");
  CHECK(weights.count("action_out_proj.weight") == 1);
  CHECK(weights.count("paligemma_with_expert.gemma_expert.model.norm.dense.weight") == 1);
}

TEST_CASE("The trainer refuses an existing run directory and a resume without checkpoints", "[train]") {
  std::ostringstream log;
  const std::string dir = fresh_dir("twice");
  vlatune::trainer::run_training(tiny_options(dir, 1), log);
  REQUIRE_THROWS_WITH(vlatune::trainer::run_training(tiny_options(dir, 1), log),
                      Catch::Contains("already holds a run") && Catch::Contains("--resume"));
  TrainOptions resume;
  resume.resume = fresh_dir("empty");
  ::mkdir(resume.resume.c_str(), 0755);
  REQUIRE_THROWS_WITH(vlatune::trainer::run_training(resume, log), Catch::Contains("train_config.json"));
}

TEST_CASE("Recipe keys are applied, and features not built yet are refused with the JSON path", "[train]") {
  std::ostringstream log;
  const std::string base = fresh_dir("recipes");
  ::mkdir(base.c_str(), 0755);

  const std::string fp8 = base + "/fp8.json";
  write_text(fp8, R"({"schema": "vlatune.recipe/1",
    "fp8": {"modules": ["paligemma_with_expert.gemma_expert.model.layers.*.mlp"]}})");
  auto o = tiny_options(base + "/run-fp8", 1);
  o.recipe_path = fp8;
  REQUIRE_THROWS_WITH(vlatune::trainer::run_training(o, log), Catch::Contains("fp8.json") &&
                                                                  Catch::Contains("$.fp8.modules") &&
                                                                  Catch::Contains("is not a Linear"));

  const std::string groups = base + "/groups.json";
  write_text(groups, R"({"schema": "vlatune.recipe/1",
    "groups": [{"name": "g", "modules": ["action_in_proj"], "cuda_graph": true}]})");
  o = tiny_options(base + "/run-groups", 1);
  o.recipe_path = groups;
  REQUIRE_THROWS_WITH(vlatune::trainer::run_training(o, log), Catch::Contains("$.groups[0].cuda_graph"));

  // Whole-step capture is CUDA-only: refused on the CPU, naming the key or the flag that asked for it.
  const std::string graph = base + "/graph.json";
  write_text(graph, R"({"schema": "vlatune.recipe/1", "model_options": {"cuda_graph": "step"}})");
  o = tiny_options(base + "/run-graph", 1);
  o.recipe_path = graph;
  REQUIRE_THROWS_WITH(vlatune::trainer::run_training(o, log), Catch::Contains("graph.json") &&
                                                                  Catch::Contains("$.model_options.cuda_graph") &&
                                                                  Catch::Contains("CUDA"));
  o = tiny_options(base + "/run-graph-flag", 1);
  o.cuda_graph = "step";
  REQUIRE_THROWS_WITH(vlatune::trainer::run_training(o, log),
                      Catch::Contains("--cuda-graph step") && Catch::Contains("CUDA"));
  o = tiny_options(base + "/run-graph-off", 1);
  o.recipe_path = graph;
  o.cuda_graph = "off";  // the flag overrides the recipe
  CHECK_NOTHROW(vlatune::trainer::run_training(o, log));

  const std::string fp8_good = base + "/fp8_good.json";
  write_text(fp8_good, R"({"schema": "vlatune.recipe/1", "fp8": {"scaling": "delayed",
    "modules": ["paligemma_with_expert.paligemma.model.language_model.layers.*.mlp.gate_proj",
                "paligemma_with_expert.gemma_expert.model.layers.*.self_attn.o_proj"]}})");
  o = tiny_options(base + "/run-fp8-good", 2);
  o.recipe_path = fp8_good;
  vlatune::trainer::run_training(o, log);
  CHECK(log.str().find("fp8 6 Linear(s)") != std::string::npos);  // 2 layers x (gate, up) + 2 o_proj
  CHECK_NOTHROW(vlatune::formats::read_run_record(base + "/run-fp8-good/run.json"));  // the numerics gate's input

  const std::string bad = base + "/nomatch.json";
  write_text(bad, R"({"schema": "vlatune.recipe/1", "recompute": {"modules": ["paligemma_with_expert.x.*"]}})");
  o = tiny_options(base + "/run-nomatch", 1);
  o.recipe_path = bad;
  REQUIRE_THROWS_WITH(vlatune::trainer::run_training(o, log), Catch::Contains("$.recompute.modules[0]"));

  const std::string good = base + "/recompute.json";
  write_text(good, R"({"schema": "vlatune.recipe/1", "batch": {"micro_batch": 3},
    "recompute": {"modules": ["paligemma_with_expert.paligemma.model.language_model.layers.*.mlp"]}})");
  o = tiny_options(base + "/run-good", 2);
  o.recipe_path = good;
  o.batch.reset();  // the recipe's micro_batch applies
  vlatune::trainer::run_training(o, log);
  auto run = vlatune::formats::read_run_record(base + "/run-good/run.json");
  CHECK(run.batch == 3);
  CHECK(log.str().find("recompute 2 module(s)") != std::string::npos);
}

TEST_CASE("Flag overrides are written into the run's recipe.json and its recipe_hash", "[train]") {
  std::ostringstream log;
  const std::string base = fresh_dir("overrides");
  ::mkdir(base.c_str(), 0755);
  // No --recipe: the effective recipe is still written, with the flags in it.
  auto o = tiny_options(base + "/plain", 1);
  o.precision = "fp32-master";
  vlatune::trainer::run_training(o, log);
  const auto recipe = vlatune::formats::read_recipe(base + "/plain/recipe.json");
  CHECK(recipe.model_options.precision == vlatune::formats::Precision::kFp32Master);
  CHECK(recipe.batch.micro_batch == 2);
  const auto run = vlatune::formats::read_run_record(base + "/plain/run.json");
  CHECK(run.environment.recipe_hash == vlatune::formats::recipe_hash(recipe));
  CHECK(run.environment.recipe_hash != vlatune::formats::recipe_hash(vlatune::formats::Recipe{}));

  // A planned recipe run as planned: its prediction is compared, the sign in words. Overridden: it is another
  // recipe, whose prediction is unknown.
  const std::string planned = base + "/planned.json";
  write_text(planned, R"({"schema": "vlatune.recipe/1", "batch": {"micro_batch": 2},
    "predicted": {"step_ms": 0.001, "peak_gib": 1.0}})");
  o = tiny_options(base + "/as-planned", 2);
  o.recipe_path = planned;
  std::ostringstream planned_log;
  vlatune::trainer::run_training(o, planned_log);
  CHECK_THAT(planned_log.str(), Catch::Contains("plan: step time measured ") &&
                                    Catch::Contains(", predicted 0.00 ms (the prediction is") &&
                                    Catch::Contains("% below the measurement)"));
  // Trimmed prompts (the default) are cheaper than the profiled ones: the check says so; untrimmed, it does not.
  CHECK_THAT(planned_log.str(), Catch::Contains("(data.trim_text: steps whose prompts are shorter"));
  const std::string untrimmed = base + "/planned_untrimmed.json";
  write_text(untrimmed, R"({"schema": "vlatune.recipe/1", "batch": {"micro_batch": 2}, "data": {"trim_text": false},
    "predicted": {"step_ms": 0.001, "peak_gib": 1.0}})");
  o = tiny_options(base + "/as-planned-untrimmed", 2);
  o.recipe_path = untrimmed;
  std::ostringstream untrimmed_log;
  vlatune::trainer::run_training(o, untrimmed_log);
  CHECK_THAT(untrimmed_log.str(), Catch::Contains("plan: step time measured ") && !Catch::Contains("data.trim_text"));
  o = tiny_options(base + "/overridden", 2);
  o.recipe_path = planned;
  o.batch = 3;
  std::ostringstream overridden_log;
  vlatune::trainer::run_training(o, overridden_log);
  CHECK(overridden_log.str().find("plan: ") == std::string::npos);
  const auto written = vlatune::formats::read_recipe(base + "/overridden/recipe.json");
  CHECK(written.batch.micro_batch == 3);
  CHECK_FALSE(written.predicted.step_ms.has_value());
}

TEST_CASE("Non-finite steps are skipped, counted, and too many in a row stop the run", "[train]") {
  std::ostringstream log;
  auto o = tiny_options(fresh_dir("nonfinite"), 50);
  o.lr = 1e30;  // the first update sends the weights to ~1e30: every later forward overflows
  o.warmup_steps = 0;
  o.decay_lr = 1e30;
  o.max_consecutive_nonfinite = 3;
  REQUIRE_THROWS_WITH(vlatune::trainer::run_training(o, log), Catch::Contains("3 consecutive steps with a non-finite"));
  CHECK(log.str().find("update skipped") != std::string::npos);
  auto rows = vlatune::formats::read_metrics(o.out + "/metrics.jsonl");
  REQUIRE(rows.size() >= 4);
  CHECK_FALSE(rows.front().skipped);
  CHECK(rows.back().skipped);
}

TEST_CASE("SIGINT finishes the step, writes a checkpoint, and the run resumes from it", "[train]") {
  std::ostringstream log;
  auto o = tiny_options(fresh_dir("sigint"), 100000);
  // Without EMA the next step is queued before the last is read: the signal then finishes that one too.
  o.ema_decay = GENERATE(0.9, 0.0);
  INFO("ema " << o.ema_decay);
  o.checkpoint_every = 0;
  const std::string metrics = o.out + "/metrics.jsonl";
  // Signal only once steps are running (the handler is installed before the first step): never kill the tests.
  std::thread interrupter([&metrics] {
    for (int i = 0; i < 6000; ++i) {
      std::ifstream f(metrics);
      int lines = 0;
      for (std::string line; std::getline(f, line);) ++lines;
      if (lines >= 3) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::raise(SIGINT);
  });
  auto s = vlatune::trainer::run_training(o, log);
  interrupter.join();
  CHECK(s.interrupted);
  REQUIRE(s.last_step >= 2);
  REQUIRE(s.last_step < 100000);
  auto latest = vlatune::trainer::latest_checkpoint(o.out);
  REQUIRE(latest);
  char name[32];
  std::snprintf(name, sizeof name, "step_%08lld", static_cast<long long>(s.last_step));
  CHECK(latest->find(name) != std::string::npos);
  CHECK(log.str().find("--resume") != std::string::npos);

  TrainOptions again;
  again.resume = o.out;
  again.steps = s.last_step + 2;
  again.progress_bar = false;
  auto r = vlatune::trainer::run_training(again, log);
  CHECK(r.first_step == s.last_step);
  CHECK(r.last_step == s.last_step + 2);
  CHECK(vlatune::formats::read_metrics(metrics).size() == static_cast<size_t>(s.last_step + 2));
}

namespace {

// Steps queued before the last one is read against steps read one by one, on `device`: a packed dataset (its
// batches carry the masks' host summary, so the shortcuts read nothing back), evaluations and checkpoints between
// steps (the next step must not be queued before them), and non-finite steps (the next update's bias correction
// depends on whether the one in flight was skipped).
void check_overlap_matches_reading_each_step(const std::string& device) {
  const std::string root = fresh_dir("overlap_" + device);
  vlatune::trainer::SynthOptions synth;
  synth.samples = 12;
  synth.seed = 3;
  synth.horizon = 6;
  synth.min_prompt = 4;
  synth.max_prompt = 30;
  synth.text_len = 48;
  synth.out = root + "/data";
  vlatune::trainer::write_synthetic_dataset(synth);
  auto run = [&](const std::string& tag, bool overlap, double lr) {
    TrainOptions o = vlatune::test::tiny_train_options(root + "/" + tag, 7);
    o.data = synth.out;
    o.eval_data = synth.out;
    o.eval_every = 2;
    o.eval_batches = 1;
    o.checkpoint_every = 3;
    o.overlap_steps = overlap;
    o.lr = lr;
    o.max_consecutive_nonfinite = 3;
    o.device = device;
    std::ostringstream log;
    try {
      vlatune::trainer::run_training(o, log);
    } catch (const std::runtime_error& e) {
      CHECK(std::string(e.what()).find("3 consecutive steps with a non-finite") != std::string::npos);
    }
    return o.out;
  };
  auto same_number = [](double a, double b) { return a == b || (std::isnan(a) && std::isnan(b)); };
  for (double lr : {1e-3, 1e30}) {  // 1e30: after the first update every forward overflows
    INFO("lr " << lr);
    const std::string tag = lr < 1 ? "a" : "b";
    const std::string one_by_one = run(tag + "_read", false, lr), overlapped = run(tag + "_overlap", true, lr);
    auto a = vlatune::formats::read_metrics(one_by_one + "/metrics.jsonl");
    auto b = vlatune::formats::read_metrics(overlapped + "/metrics.jsonl");
    REQUIRE(a.size() == b.size());
    REQUIRE(a.size() >= 4);
    for (size_t i = 0; i < a.size(); ++i) {
      INFO("step " << a[i].step);
      CHECK(a[i].step == b[i].step);
      CHECK(same_number(a[i].loss, b[i].loss));
      CHECK(same_number(a[i].grad_norm, b[i].grad_norm));
      CHECK(a[i].skipped == b[i].skipped);
    }
    const auto eval_a = vlatune::formats::read_metrics_log(one_by_one + "/metrics.jsonl").eval;
    const auto eval_b = vlatune::formats::read_metrics_log(overlapped + "/metrics.jsonl").eval;
    REQUIRE(eval_a.size() == eval_b.size());
    for (size_t i = 0; i < eval_a.size(); ++i) {
      CHECK(eval_a[i].step == eval_b[i].step);
      CHECK(same_number(eval_a[i].loss, eval_b[i].loss));
      CHECK(same_number(eval_a[i].action_mae, eval_b[i].action_mae));
    }
    std::vector<std::string> files = {"checkpoints/step_00000003/model.safetensors",
                                      "checkpoints/step_00000003/optimizer.safetensors"};
    if (lr < 1) {
      CHECK(eval_a.size() == 4);  // after steps 2, 4, 6 and the last
      files.push_back("final/model.safetensors");
    } else {
      CHECK(a.back().skipped);
    }
    for (const std::string& file : files) {
      INFO(file);
      auto x = load_all(one_by_one + "/" + file), y = load_all(overlapped + "/" + file);
      REQUIRE(x.size() == y.size());
      for (const auto& [name, t] : x) {
        INFO(name);
        REQUIRE(y.count(name) == 1);
        CHECK(torch::equal(t, y[name]));
      }
    }
  }
}

}  // namespace

TEST_CASE("Steps queued before the last one is read train exactly as steps read one by one", "[train]") {
  check_overlap_matches_reading_each_step("cpu");
}

TEST_CASE("On the GPU steps queued before the last one is read train exactly as steps read one by one",
          "[.gpu][train]") {
  REQUIRE(torch::cuda::is_available());
  check_overlap_matches_reading_each_step("cuda");
}

TEST_CASE("On the GPU a step queued behind one in flight makes no host sync", "[.gpu][train]") {
  REQUIRE(torch::cuda::is_available());
  const std::string root = fresh_dir("no_sync");
  vlatune::trainer::SynthOptions synth;
  synth.samples = 8;
  synth.min_prompt = 4;
  synth.max_prompt = 30;
  synth.text_len = 48;
  synth.out = root + "/data";
  vlatune::trainer::write_synthetic_dataset(synth);
  for (const std::string data : {synth.out, std::string("synthetic")}) {
    INFO(data);
    TrainOptions o = vlatune::test::tiny_train_options(root + "/run", 4);
    o.device = "cuda";
    o.data = data;
    std::ostringstream log;
    vlatune::trainer::TrainingParts parts = vlatune::trainer::build_training_parts(
        o, vlatune::formats::Recipe{}, "default", /*load_init_weights=*/true, log);
    vlatune::trainer::run_train_step(parts, 0, 1e-3, 1.0);  // first use: plans, caches, allocations
    vlatune::trainer::QueuedStep first = vlatune::trainer::queue_train_step(parts, 1, 1e-3, 1.0);
    auto& state = c10::cuda::warning_state();
    state.set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
    std::optional<vlatune::trainer::QueuedStep> second;
    std::string error;
    try {
      second = vlatune::trainer::queue_train_step(parts, 2, 1e-3, 1.0, &first);
    } catch (const std::exception& e) {
      error = e.what();
    }
    state.set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
    INFO(error);
    // The synthetic source draws its prompt lengths on the device: with text trimming on (the default) the
    // forward reads the masks back; a dataset's batches carry their summary.
    CHECK(error.empty() == (data != "synthetic"));
    if (!second) continue;
    const auto a = vlatune::trainer::finish_train_step(parts, first);
    const auto b = vlatune::trainer::finish_train_step(parts, *second);
    CHECK(std::isfinite(a.loss));
    CHECK(std::isfinite(b.loss));
    CHECK(b.optimizer.step == 3);
  }
}

TEST_CASE("--init-weights starts from a checkpoint written under the openpi names", "[train]") {
  std::ostringstream log;
  const std::string a = fresh_dir("source");
  vlatune::trainer::run_training(tiny_options(a, 1), log);
  auto o = tiny_options(fresh_dir("init"), 1);
  o.init_weights = a + "/final/model.safetensors";
  o.lr = 0.0;  // no update: the final weights are the loaded ones
  o.decay_lr = 0.0;
  o.weight_decay = 0.0;
  o.ema_decay = 0.0;
  vlatune::trainer::run_training(o, log);
  CHECK(log.str().find("init weights: ") != std::string::npos);
  auto src = load_all(a + "/final/model.safetensors"), dst = load_all(o.out + "/final/model.safetensors");
  REQUIRE(src.size() == dst.size());
  for (const auto& [name, t] : src) {
    INFO(name);
    CHECK(torch::equal(t, dst[name]));
  }
}

TEST_CASE("Gradient accumulation runs micro-batches per optimizer step and counts their samples", "[train]") {
  std::ostringstream log;
  auto o = tiny_options(fresh_dir("accum"), 3);
  o.grad_accum = 3;
  vlatune::trainer::run_training(o, log);
  auto run = vlatune::formats::read_run_record(o.out + "/run.json");
  CHECK(run.batch == 6);  // batch 2 x 3 micro-batches
  auto rows = vlatune::formats::read_metrics(o.out + "/metrics.jsonl");
  REQUIRE(rows.size() == 3);
  for (const auto& row : rows) {
    CHECK(std::isfinite(row.loss));
    CHECK(row.samples_per_s == Approx(6.0 / (row.step_ms / 1e3)).epsilon(1e-9));
  }
  CHECK(log.str().find("batch 2 x 3") != std::string::npos);
}

TEST_CASE("Captured steps train as the eager steps do, and the graph is captured once for static shapes",
          "[.gpu][train]") {
  REQUIRE(torch::cuda::is_available());
  const std::string base = fresh_dir("graph");
  ::mkdir(base.c_str(), 0755);
  const std::string no_trim = base + "/no_trim.json";
  write_text(no_trim, R"({"schema": "vlatune.recipe/1", "data": {"trim_text": false}})");
  auto options = [&](const std::string& name, const char* graph) {
    auto o = tiny_options(base + "/" + name, 6);
    o.device = "cuda";
    o.recipe_path = no_trim;
    o.lr = 0.05;  // large, changing steps (warmup): a stale learning rate in the replays would show
    o.warmup_steps = 4;
    o.checkpoint_every = 3;  // written between replays
    o.cuda_graph = graph;
    return o;
  };
  std::ostringstream eager_log, graph_log;
  vlatune::trainer::run_training(options("eager", "off"), eager_log);
  vlatune::trainer::run_training(options("graph", "step"), graph_log);
  INFO(graph_log.str());
  // Step 0 eager (set-up), step 1 captured and replayed, steps 2-5 replayed.
  CHECK(graph_log.str().find("cuda graph: 5 step(s) replayed, 1 eager, 1 capture(s)") != std::string::npos);
  const auto a = vlatune::formats::read_metrics(base + "/eager/metrics.jsonl");
  const auto b = vlatune::formats::read_metrics(base + "/graph/metrics.jsonl");
  REQUIRE(a.size() == 6);
  REQUIRE(b.size() == 6);
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("step " << i);
    CHECK(b[i].loss == Approx(a[i].loss).epsilon(5e-3));
    CHECK(b[i].grad_norm == Approx(a[i].grad_norm).epsilon(5e-3));
    CHECK(b[i].peak_gib > 0.0);
  }
  const auto wa = load_all(base + "/eager/final/model.safetensors");
  const auto wb = load_all(base + "/graph/final/model.safetensors");
  REQUIRE(wa.size() == wb.size());
  for (const auto& [name, t] : wa) {
    INFO(name);
    const torch::Tensor x = t.to(torch::kFloat64), y = wb.at(name).to(torch::kFloat64);
    CHECK((x - y).norm().item<double>() <= 5e-3 * x.norm().item<double>() + 1e-6);
  }
}
