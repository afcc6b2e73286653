// Held-out evaluation (trainer/evaluate.h), `train --eval-data`, and the `sample` / `eval` / `profile --inference`
// verbs on the tiny config: fixed-seed numbers that repeat, the loss of the training forward, the action error in
// the dataset's real units, evaluation rows in metrics.jsonl, and the verbs' outputs and refusals.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli_test_util.h"
#include "data_test_util.h"
#include "formats/json_io.h"
#include "formats/metrics_jsonl.h"
#include "formats/profile.h"
#include "model/batch_io.h"
#include "model/pi05.h"
#include "model/safetensors_io.h"
#include "model/sample.h"
#include "model/state_dict.h"
#include "tensor_test_util.h"
#include "trainer/dataset.h"
#include "trainer/evaluate.h"
#include "trainer/loader.h"
#include "trainer/synthetic.h"

using vlatune::test::run_cli;
using vlatune::test::TempTree;
using namespace vlatune;

namespace {

// A synthetic tiny dataset of `samples` whose action statistics are rewritten to per-dim ranges other than
// [-1, 1] (the records stay as written: the stats only say which real units they stand for).
std::string eval_dataset(const TempTree& tmp, int64_t samples) {
  trainer::SynthOptions o;
  o.samples = samples;
  o.seed = 3;
  o.horizon = 6;
  o.min_prompt = 4;
  o.max_prompt = 30;
  o.text_len = 48;
  o.out = tmp / "data";
  trainer::write_synthetic_dataset(o);
  nlohmann::json m = formats::read_json_file(o.out + "/manifest.json");
  auto& actions = m["norm_stats"]["actions"];
  for (int d = 0; d < 7; ++d) {
    actions["q01"][d] = -0.5 * (d + 1);
    actions["q99"][d] = 2.0 * (d + 1);
  }
  actions.erase("mean");
  actions.erase("std");
  formats::write_file_atomic(o.out + "/manifest.json", m.dump(2));
  return o.out;
}

model::Pi05 tiny_model(uint64_t seed) {
  model::Pi05 net(model::Pi05Config::tiny(), torch::kCPU, torch::kFloat32);
  model::init_weights(*net, seed);
  return net;
}

}  // namespace

TEST_CASE("Evaluating the same weights twice gives the same numbers: the training loss and real-unit action error",
          "[eval]") {
  TempTree tmp;
  const std::string data = eval_dataset(tmp, 8);
  model::Pi05 net = tiny_model(31);
  trainer::EvalOptions o;
  o.batch = 4;
  o.seed = 7;
  o.sample_steps = 2;
  trainer::Evaluator evaluator(data, net->config(), torch::kCPU, o);
  const trainer::EvalResult a = evaluator.run(*net);
  const trainer::EvalResult b = evaluator.run(*net);
  CHECK(a.batches == 2);  // 8 samples / 4: each once
  CHECK(a.samples == 8);
  CHECK(a.loss == b.loss);
  CHECK(a.action_mae_per_dim == b.action_mae_per_dim);
  CHECK(a.action_rmse_per_dim == b.action_rmse_per_dim);
  REQUIRE(a.action_mae_per_dim.size() == 7);

  // The same batches rebuilt from the loader's contract (order, noise and time from the seed): the loss is the
  // training forward's, and the action error is the sampled chunk's, scaled to real units per dim.
  auto dataset = trainer::Dataset::open(data);
  trainer::LoaderOptions lo;
  lo.workers = 1;
  trainer::DatasetLoader loader(dataset, net->config(), 4, 7, torch::kCPU, lo);
  model::SampleOptions so;
  so.num_steps = 2;
  model::Sampler sampler(*net, so);
  double loss = 0;
  std::vector<double> mae(7, 0.0), sq(7, 0.0);
  torch::NoGradGuard no_grad;
  for (int64_t step = 0; step < 2; ++step) {
    const model::Pi05Batch batch = loader.next(step, nullptr);
    loss += net->forward(batch).loss.item<double>() / 2;
    const torch::Tensor diff = (sampler.sample(batch, batch.noise) - batch.actions).to(torch::kFloat64);
    for (int d = 0; d < 7; ++d) {
      const double scale = (2.0 * (d + 1) - -0.5 * (d + 1) + 1e-6) / 2;  // (q99 - q01 + 1e-6) / 2
      mae[static_cast<size_t>(d)] += diff.select(2, d).abs().sum().item<double>() * scale / (8 * 6);
      sq[static_cast<size_t>(d)] += diff.select(2, d).pow(2).sum().item<double>() * scale * scale / (8 * 6);
    }
  }
  CHECK(a.loss == Approx(loss).epsilon(1e-6));
  double mae_all = 0;
  for (int d = 0; d < 7; ++d) {
    INFO("dim " << d);
    CHECK(a.action_mae_per_dim[static_cast<size_t>(d)] == Approx(mae[static_cast<size_t>(d)]).epsilon(1e-4));
    CHECK(a.action_rmse_per_dim[static_cast<size_t>(d)] == Approx(std::sqrt(sq[static_cast<size_t>(d)])).epsilon(1e-4));
    mae_all += mae[static_cast<size_t>(d)] / 7;
  }
  CHECK(a.action_mae == Approx(mae_all).epsilon(1e-4));
  // Other weights, other numbers (the evaluation reads the model it is given).
  model::Pi05 other = tiny_model(32);
  CHECK(evaluator.run(*other).loss != a.loss);
}

TEST_CASE("The evaluation row of a result carries its fields and passes the metrics reader", "[eval]") {
  trainer::EvalResult r;
  r.batches = 2;
  r.samples = 8;
  r.loss = 0.5;
  r.action_mae = 0.1;
  r.action_rmse = 0.2;
  r.action_mae_per_dim = {0.1, 0.1};
  r.action_rmse_per_dim = {0.2, 0.2};
  r.eval_ms = 3;
  const formats::EvalRow row = trainer::eval_row(40, r, 10);
  CHECK(row.step == 40);
  CHECK(row.sample_steps == 10);
  CHECK(formats::parse_eval_row(formats::eval_row_to_json(row), "x") == row);
}

TEST_CASE("An evaluation that does not fit its dataset is refused, naming the dataset", "[eval]") {
  TempTree tmp;
  const std::string data = eval_dataset(tmp, 4);
  trainer::EvalOptions o;
  o.horizon = 9;  // the dataset stores chunks of 6
  CHECK_THROWS_WITH(trainer::Evaluator(data, model::Pi05Config::tiny(), torch::kCPU, o),
                    Catch::Contains(data) && Catch::Contains("horizon 9 asked, the dataset stores chunks of 6"));
  o = {};
  o.sample_steps = 0;
  CHECK_THROWS_WITH(trainer::Evaluator(data, model::Pi05Config::tiny(), torch::kCPU, o),
                    Catch::Contains("sample steps must be >= 1"));
}

TEST_CASE("vlatune eval prints the evaluation twice the same, and refuses bad input with exit 4", "[eval][cli]") {
  TempTree tmp;
  const std::string data = eval_dataset(tmp, 4);
  {
    model::Pi05 net = tiny_model(33);
    model::save_state_dict(*net, tmp / "w.safetensors");
  }
  const std::vector<std::string> args = {
      "eval", "--weights", tmp / "w.safetensors", "--data", data, "--batch", "4", "--steps", "2", "--device", "cpu"};
  const auto first = run_cli(args), second = run_cli(args);
  INFO(first.err);
  REQUIRE(first.code == 0);
  auto a = nlohmann::json::parse(first.out), b = nlohmann::json::parse(second.out);
  a.erase("eval_ms");
  b.erase("eval_ms");
  CHECK(a == b);
  CHECK(a.at("batches") == 1);
  CHECK(a.at("samples") == 4);
  CHECK(a.at("sample_steps") == 2);
  CHECK(a.at("action_mae_per_dim").size() == 7);
  CHECK(a.at("action_dims") == 7);

  auto bad = args;
  bad[2] = tmp / "missing.safetensors";
  CHECK(run_cli(bad).code == 4);
  bad = args;
  bad[4] = tmp.path;  // not a dataset
  const auto not_dataset = run_cli(bad);
  CHECK(not_dataset.code == 4);
  CHECK_THAT(not_dataset.err, Catch::Contains("manifest.json"));
  bad = args;
  bad[6] = "0";
  CHECK(run_cli(bad).code == 4);
}

TEST_CASE("train --eval-data writes evaluation rows after the due steps, equal to vlatune eval of the same weights",
          "[eval][train][cli]") {
  TempTree tmp;
  const std::string data = eval_dataset(tmp, 8);
  const auto r = run_cli({"train",
                          "--config",
                          "tiny",
                          "--device",
                          "cpu",
                          "--data",
                          "synthetic",
                          "--batch",
                          "4",
                          "--steps",
                          "3",
                          "--timing-warmup",
                          "0",
                          "--workers",
                          "1",
                          "--checkpoint-every",
                          "0",
                          "--no-progress",
                          "--out",
                          tmp / "run",
                          "--eval-data",
                          data,
                          "--eval-every",
                          "2",
                          "--eval-batches",
                          "1"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("eval after step 2/3") && Catch::Contains("eval after step 3/3"));
  const formats::MetricsLog log = formats::read_metrics_log(tmp / "run/metrics.jsonl");
  REQUIRE(log.train.size() == 3);
  REQUIRE(log.eval.size() == 2);  // after every 2nd step and after the last
  CHECK(log.eval[0].step == 1);
  CHECK(log.eval[1].step == 2);
  for (const formats::EvalRow& e : log.eval) {
    CHECK(e.batches == 1);
    CHECK(e.samples == 4);
    CHECK(e.sample_steps == 10);
    CHECK(e.action_mae_per_dim.size() == 7);
    CHECK(std::isfinite(e.loss));
  }
  // Each evaluation row follows its step's training row.
  std::vector<std::string> order;
  std::istringstream lines(vlatune::test::read_file_bytes(tmp / "run/metrics.jsonl"));
  for (std::string line; std::getline(lines, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (!j.contains("step")) continue;  // the header
    order.push_back(j.value("kind", std::string("train")) + std::to_string(j.at("step").get<int64_t>()));
  }
  CHECK(order == std::vector<std::string>{"train0", "train1", "eval1", "train2", "eval2"});

  // The last row is what `vlatune eval` says of the final weights (the run's micro-batch, seed 0, 10 steps).
  const auto e = run_cli({"eval", "--config", "tiny", "--device", "cpu", "--weights", tmp / "run/final", "--data", data,
                          "--batch", "4", "--batches", "1"});
  INFO(e.err);
  REQUIRE(e.code == 0);
  const nlohmann::json j = nlohmann::json::parse(e.out);
  CHECK(j.at("loss").get<double>() == Approx(log.eval[1].loss).epsilon(1e-5));
  CHECK(j.at("action_mae").get<double>() == Approx(log.eval[1].action_mae).epsilon(1e-4));

  const auto orphan = run_cli({"train", "--config", "tiny", "--device", "cpu", "--data", "synthetic", "--steps", "1",
                               "--out", tmp / "run2", "--eval-every", "2"});
  CHECK(orphan.code == 4);
  CHECK_THAT(orphan.err, Catch::Contains("--eval-every and --eval-batches need --eval-data"));
}

TEST_CASE(
    "vlatune sample writes the sampler's chunks, in real units with norm stats, from the batch's noise or a "
    "seed",
    "[sample][cli]") {
  TempTree tmp;
  model::Pi05 net = tiny_model(34);
  model::save_state_dict(*net, tmp / "w.safetensors");
  torch::Generator gen = at::detail::createCPUGenerator(2);
  const auto cfg = model::Pi05Config::tiny();
  model::Pi05Batch b = model::make_random_batch(cfg, 2, 3, 2, 32, 3, 20, 5, &gen, torch::kCPU);
  model::write_batch(tmp / "batch.safetensors", b);
  trainer::NormStats norm;
  norm.actions = {{-1.f, 0.f, 2.f}, {1.f, 4.f, 3.f}, {}, {}};
  norm.state = {{0.f}, {1.f}, {}, {}};
  vlatune::test::write_file_bytes(tmp / "norm.json", trainer::norm_stats_file_json(norm).dump());

  const auto r =
      run_cli({"sample", "--weights", tmp / "w.safetensors", "--batch", tmp / "batch.safetensors", "--device", "cpu",
               "--steps", "2", "--norm-stats", tmp / "norm.json", "--out", tmp / "out.safetensors"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK(nlohmann::json::parse(r.out).at("noise") == "batch");
  auto file = model::SafetensorsFile::open(tmp / "out.safetensors");
  const torch::Tensor actions = file.tensor("actions"), real = file.tensor("actions_real");
  model::SampleOptions so;
  so.num_steps = 2;
  const torch::Tensor expected = model::Sampler(*net, so).sample(b, b.noise);
  CHECK(vlatune::test::rel_err(actions, expected) < 1e-6);
  REQUIRE(real.sizes() == torch::IntArrayRef({2, 5, 3}));
  for (int d = 0; d < 3; ++d) {
    const torch::Tensor want =
        (expected.select(2, d) + 1) / 2 * (norm.actions.q99[d] - norm.actions.q01[d] + 1e-6) + norm.actions.q01[d];
    CHECK(vlatune::test::rel_err(real.select(2, d), want) < 1e-6);
  }

  // A batch without noise: drawn from --noise-seed, with --horizon.
  model::write_safetensors(
      tmp / "obs.safetensors",
      {{"images", b.images}, {"image_masks", b.image_masks}, {"tokens", b.tokens}, {"token_masks", b.token_masks}});
  const auto seeded =
      run_cli({"sample", "--weights", tmp / "w.safetensors", "--batch", tmp / "obs.safetensors", "--device", "cpu",
               "--horizon", "7", "--noise-seed", "11", "--steps", "2", "--out", tmp / "seeded.safetensors"});
  INFO(seeded.err);
  REQUIRE(seeded.code == 0);
  const torch::Tensor noise = model::sample_noise(2, 7, 32, 11);
  CHECK(torch::equal(model::SafetensorsFile::open(tmp / "seeded.safetensors").tensor("noise"), noise));
  CHECK(vlatune::test::rel_err(model::SafetensorsFile::open(tmp / "seeded.safetensors").tensor("actions"),
                               model::Sampler(*net, so).sample(b, noise)) < 1e-6);

  // Refusals: a horizon that contradicts the batch's noise, a batch missing a tensor, zero steps.
  const auto clash = run_cli({"sample", "--weights", tmp / "w.safetensors", "--batch", tmp / "batch.safetensors",
                              "--device", "cpu", "--horizon", "9"});
  CHECK(clash.code == 4);
  CHECK_THAT(clash.err, Catch::Contains("the batch's noise has horizon 5"));
  model::write_safetensors(tmp / "no_tokens.safetensors", {{"images", b.images}, {"image_masks", b.image_masks}});
  const auto missing = run_cli(
      {"sample", "--weights", tmp / "w.safetensors", "--batch", tmp / "no_tokens.safetensors", "--device", "cpu"});
  CHECK(missing.code == 4);
  CHECK_THAT(missing.err, Catch::Contains("tensor 'tokens': missing"));
  CHECK(run_cli({"sample", "--batch", tmp / "batch.safetensors", "--steps", "0"}).code == 4);
}

TEST_CASE("profile --inference times sampled chunks at batch 1 by module: vision, backbone, expert, no backward",
          "[profile][sample][cli]") {
  TempTree tmp;
  const auto r = run_cli({"profile",       "--inference", "--config",      "tiny", "--device",       "cpu",
                          "--warmup",      "1",           "--timed-steps", "2",    "--steps",        "1",
                          "--trace-steps", "0",           "--gemm-reps",   "0",    "--sample-steps", "3",
                          "--text-len",    "48",          "--prompt-len",  "10",   "--out",          tmp / "prof"});
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
  const formats::Profile p = formats::read_profile(tmp / "prof/profile.json");
  CHECK_THAT(p.settings.data, Catch::StartsWith("inference: one action chunk per step (batch 1"));
  CHECK(p.settings.workload == "inference");  // what `vlatune plan` refuses
  REQUIRE(p.batches.size() == 1);
  const formats::BatchProfile& b = p.batches[0];
  CHECK(b.batch == 1);
  CHECK(b.memory.gradient_bytes == int64_t{0});
  for (const std::string fqn : {"paligemma_with_expert.paligemma.model.vision_tower",
                                "paligemma_with_expert.paligemma.model.language_model.layers.0",
                                "paligemma_with_expert.gemma_expert.model.layers.0"}) {
    INFO(fqn);
    const auto it =
        std::find_if(b.modules.begin(), b.modules.end(), [&](const formats::ModuleCost& m) { return m.fqn == fqn; });
    REQUIRE(it != b.modules.end());
    CHECK(it->forward_ms > 0);
    CHECK(it->backward_ms == 0);
  }
  const auto batched = run_cli(
      {"profile", "--inference", "--config", "tiny", "--device", "cpu", "--batch", "2", "--out", tmp / "prof2"});
  CHECK(batched.code == 4);
  CHECK_THAT(batched.err, Catch::Contains("batch 1"));
}
