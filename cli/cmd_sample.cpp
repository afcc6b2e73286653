// `vlatune sample`: action chunks from a trained policy (openpi's sample_actions: prefix K/V cached once, then
// --steps Euler steps of the action expert) for a batch in the `forward` format. Prints one JSON object; --out
// writes the chunks. --bench N measures latency per chunk (median ms, with the vision / prefix / suffix split).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>

#include <nlohmann/json.hpp>

#include "cli/cli.h"
#include "cli/policy_options.h"
#include "cli/torch_options.h"
#include "cli/validators.h"
#include "formats/numbers.h"
#include "model/batch_io.h"
#include "model/pi05.h"
#include "model/safetensors_io.h"
#include "model/sample.h"

namespace vlatune::cli {

struct SampleCliOptions {
  std::string config;  // empty: policy_config_name()
  std::string weights;
  uint64_t seed = 0;
  std::string batch;
  int64_t steps = 10;
  int64_t horizon = 0;
  uint64_t noise_seed = 0;
  std::string dtype = "fp32";
  std::string device = "auto";
  bool cuda_graph = false;
  std::string norm_stats;
  std::string out;
  int64_t bench = 0;
};

namespace {

// Median latency of `runs` chunks end to end (device synchronized after each), then the same number of calls with
// the phase split (synchronized at each boundary, so their sum slightly exceeds the end-to-end time).
nlohmann::json bench(model::Sampler& sampler, const model::Pi05Batch& batch, const torch::Tensor& noise, int64_t runs,
                     torch::Device device) {
  auto sync = [&] {
    if (device.is_cuda()) torch::cuda::synchronize(device.index());
  };
  for (int i = 0; i < 3; ++i) sampler.sample(batch, noise);  // warm-up (and the graph capture)
  sync();
  std::vector<double> chunk, vision, prefix, suffix;
  for (int64_t i = 0; i < runs; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    sampler.sample(batch, noise);
    sync();
    chunk.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  for (int64_t i = 0; i < runs; ++i) {
    model::SampleTiming t;
    sampler.sample(batch, noise, &t);
    vision.push_back(t.vision_ms);
    prefix.push_back(t.prefix_ms);
    suffix.push_back(t.suffix_ms);
  }
  return {{"runs", runs},
          {"chunk_ms_median", formats::median(chunk)},
          {"chunk_ms_min", *std::min_element(chunk.begin(), chunk.end())},
          {"chunk_ms_max", *std::max_element(chunk.begin(), chunk.end())},
          {"vision_ms_median", formats::median(vision)},
          {"prefix_ms_median", formats::median(prefix)},
          {"suffix_ms_median", formats::median(suffix)}};
}

}  // namespace

static int run_sample(const SampleCliOptions& o, Context& ctx) {
  const auto device = parse_device("--device", o.device);
  const std::string config = policy_config_name(o.config, device);
  const auto cfg = model::Pi05Config::named(config);
  const auto dtype = parse_dtype("--dtype", o.dtype);
  require_distinct_output(
      "--out", o.out,
      {{"--weights", o.weights.empty() ? std::string() : weights_file(o.weights)}, {"--batch", o.batch}});
  model::Pi05Batch batch;
  try {
    batch = model::read_observation_batch(o.batch, cfg);
  } catch (const std::exception& e) {
    throw BadInput(std::string("--batch: ") + e.what());
  }
  const int64_t b = batch.tokens.size(0);
  torch::Tensor noise = batch.noise;
  if (noise.defined()) {
    if (o.horizon > 0 && noise.size(1) != o.horizon)
      throw BadInput("--horizon " + std::to_string(o.horizon) + ": the batch's noise has horizon " +
                     std::to_string(noise.size(1)));
  } else {
    const int64_t horizon = o.horizon > 0 ? o.horizon : batch.actions.defined() ? batch.actions.size(1) : 10;
    noise = model::sample_noise(b, horizon, cfg.action_dim, o.noise_seed);
  }
  std::string norm_path = o.norm_stats.empty() ? default_norm_stats(o.weights) : o.norm_stats;
  std::optional<trainer::NormStats> norm;
  if (!norm_path.empty()) norm = read_norm_stats_flag("--norm-stats", norm_path);
  if (norm && static_cast<int64_t>(norm->actions.q01.size()) > cfg.action_dim)
    throw BadInput("--norm-stats " + norm_path + ": " + std::to_string(norm->actions.q01.size()) +
                   " action dims exceed the model's " + std::to_string(cfg.action_dim));

  model::Pi05 net = load_policy_model(cfg, o.weights, o.seed, device, dtype);
  for (torch::Tensor* t : model::batch_tensors(batch))
    if (t->defined()) *t = t->to(device);
  model::SampleOptions so;
  so.num_steps = o.steps;
  so.cuda_graph = o.cuda_graph;
  model::Sampler sampler(*net, so);
  const torch::Tensor actions = sampler.sample(batch, noise.to(device)).to(torch::kCPU, torch::kFloat32).contiguous();

  nlohmann::json report = {{"batch", b},
                           {"horizon", noise.size(1)},
                           {"steps", o.steps},
                           {"noise", batch.noise.defined() ? "batch" : "seed " + std::to_string(o.noise_seed)}};
  if (!o.out.empty()) {
    std::vector<std::pair<std::string, torch::Tensor>> tensors{{"actions", actions},
                                                               {"noise", noise.to(torch::kFloat32).contiguous()}};
    if (norm) {
      // Real units: openpi's Unnormalize on the first D dims, then cut to the robot's D dims.
      const auto d = static_cast<int64_t>(norm->actions.q01.size());
      torch::Tensor real = actions.clone();
      trainer::unnormalize_quantile(real.data_ptr<float>(), real.numel() / cfg.action_dim, cfg.action_dim,
                                    norm->actions);
      tensors.emplace_back("actions_real", real.narrow(2, 0, d).contiguous());
    }
    model::write_safetensors(o.out, tensors, {{"vlatune.config", config}, {"vlatune.steps", std::to_string(o.steps)}});
    report["out"] = o.out;
  }
  if (o.bench > 0) {
    report["bench"] = bench(sampler, batch, noise.to(device), o.bench, device);
    report["device"] = device.str();
    report["dtype"] = o.dtype;
  }
  if (o.cuda_graph) report["cuda_graph"] = sampler.graph_status();
  ctx.out << report.dump() << "\n";
  return kExitOk;
}

void setup_sample(CLI::App& app, Context& ctx) {
  auto opts = std::make_shared<SampleCliOptions>();
  auto* cmd = app.add_subcommand("sample",
                                 "Sample action chunks from a policy (prefix K/V cached, Euler steps of the "
                                 "action expert) for a batch; writes actions [B, H, 32] (and real units)");
  cmd->option_defaults()->always_capture_default();
  cmd->add_option("--config", opts->config, "Model size (default: full on a GPU, tiny on the CPU)")
      ->check(CLI::IsMember({"tiny", "full"}));
  cmd->add_option("--weights", opts->weights,
                  "Weights: a safetensors file (openpi or LeRobot names) or a run's final/ directory (default: "
                  "random weights from --seed)")
      ->check(file_or_directory());
  cmd->add_option("--seed", opts->seed, "Random weights seed when --weights is omitted")->check(unsigned_integer());
  cmd->add_option("--batch", opts->batch,
                  "Batch (safetensors, the forward format; actions and time optional, its noise used when present)")
      ->required()
      ->check(regular_file());
  cmd->add_option("--steps", opts->steps, "Euler steps (openpi: 10)")->check(CLI::Range(1, 1000));
  cmd->add_option("--horizon", opts->horizon,
                  "Action chunk length when the batch has no noise (default: its actions' length, else 10)")
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--noise-seed", opts->noise_seed, "Seed of the noise when the batch has none")
      ->check(unsigned_integer());
  cmd->add_option("--dtype", opts->dtype, "Parameter and compute dtype")
      ->check(CLI::IsMember({"fp32", "bf16", "fp64"}));
  cmd->add_option("--device", opts->device, "auto: GPU when visible")->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  cmd->add_flag("--cuda-graph", opts->cuda_graph, "Capture the denoising loop as one CUDA graph (CUDA only)");
  cmd->add_option("--norm-stats", opts->norm_stats,
                  "norm_stats.json (openpi layout) to also write actions_real, un-normalized and cut to the real "
                  "action dims (default: WEIGHTS/norm_stats.json when WEIGHTS is a directory)")
      ->check(regular_file());
  cmd->add_option("--out", opts->out,
                  "Write actions (and actions_real, noise) to this safetensors file (default: only the JSON report)");
  cmd->add_option("--bench", opts->bench, "Time N more chunks: median ms per chunk and its vision/prefix/suffix split")
      ->check(CLI::Range(0, 100000));
  cmd->callback([&ctx, opts] { ctx.action = [&ctx, opts] { return run_sample(*opts, ctx); }; });
}

}  // namespace vlatune::cli
