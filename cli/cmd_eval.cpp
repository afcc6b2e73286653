// `vlatune eval`: a policy on held-out data (trainer/evaluate.h): the flow-matching loss with noise and time from
// a fixed seed, and the error of sampled action chunks in real units, overall and per action dim. Prints one JSON
// object.
#include <CLI/CLI.hpp>

#include <iomanip>
#include <memory>

#include <nlohmann/json.hpp>

#include "cli/cli.h"
#include "cli/policy_options.h"
#include "cli/torch_options.h"
#include "cli/validators.h"
#include "formats/json_error.h"
#include "formats/metrics_jsonl.h"
#include "trainer/evaluate.h"

namespace vlatune::cli {

struct EvalCliOptions {
  std::string config;  // empty: policy_config_name()
  std::string weights;
  std::string data;
  int64_t batches = 0;
  int64_t batch = 8;
  uint64_t seed = 0;
  int64_t steps = 10;
  int64_t horizon = 0;
  int64_t loss_action_dim = 32;
  std::string dtype = "fp32";
  std::string device = "auto";
  int workers = 2;
};

static int run_eval(const EvalCliOptions& o, Context& ctx) {
  const auto device = parse_device("--device", o.device);
  const std::string config = policy_config_name(o.config, device);
  const auto cfg = model::Pi05Config::named(config);
  const auto dtype = parse_dtype("--dtype", o.dtype);
  trainer::EvalOptions eo;
  eo.batch = o.batch;
  eo.batches = o.batches;
  eo.seed = o.seed;
  eo.sample_steps = o.steps;
  eo.horizon = o.horizon;
  eo.workers = o.workers;
  eo.forward.loss_action_dim = o.loss_action_dim;
  std::unique_ptr<trainer::Evaluator> evaluator;
  try {
    evaluator = std::make_unique<trainer::Evaluator>(o.data, cfg, device, eo);
  } catch (const formats::FormatError& e) {
    throw BadInput(std::string("--data: ") + e.what());
  } catch (const std::invalid_argument& e) {
    throw BadInput(std::string("--data: ") + e.what());
  }
  model::Pi05 net = load_policy_model(cfg, o.weights, 0, device, dtype);
  ctx.err << "vlatune eval: " << evaluator->describe() << std::endl;
  const trainer::EvalResult r = evaluator->run(*net);
  // The metrics.jsonl evaluation row's fields (null for a non-finite value), without its step and kind.
  nlohmann::json j = formats::eval_row_to_json(trainer::eval_row(0, r, o.steps));
  j.erase("kind");
  j.erase("step");
  j["data"] = o.data;
  j["action_dims"] = evaluator->action_dim();
  ctx.out << j.dump() << "\n";
  ctx.err << std::setprecision(4) << "vlatune eval: loss " << r.loss << ", action error (real units) MAE "
          << r.action_mae << ", RMSE " << r.action_rmse << " over " << r.samples << " samples" << std::endl;
  return kExitOk;
}

void setup_eval(CLI::App& app, Context& ctx) {
  auto opts = std::make_shared<EvalCliOptions>();
  auto* cmd = app.add_subcommand("eval",
                                 "Evaluate a policy on held-out data: flow-matching loss (fixed noise and time) and "
                                 "the error of sampled action chunks in real units, overall and per dim");
  cmd->add_option("--config", opts->config, "Model size (default: full on a GPU, tiny on the CPU)")
      ->check(CLI::IsMember({"tiny", "full"}));
  cmd->add_option("--weights", opts->weights,
                  "Weights: a safetensors file (openpi or LeRobot names) or a run's final/ directory")
      ->required()
      ->check(file_or_directory());
  cmd->add_option("--data", opts->data,
                  "Held-out packed dataset (e.g. DATA/val of `data import --val-episodes`); its norm stats turn "
                  "the action error into real units")
      ->required()
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--batches", opts->batches, "Batches to evaluate (default: dataset size / batch, each sample once)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  cmd->add_option("--batch", opts->batch, "Samples per batch")->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--seed", opts->seed, "Seed of the batch order, noise and time (fixed: same weights, same numbers)")
      ->check(unsigned_integer());
  cmd->add_option("--steps", opts->steps, "Euler steps per sampled chunk (openpi: 10)")->check(CLI::Range(1, 1000));
  cmd->add_option("--horizon", opts->horizon, "Action chunk length (default: the dataset's)")
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--loss-action-dim", opts->loss_action_dim,
                  "The loss averages the first N action dims (openpi: 32; LeRobot: the real dims)")
      ->check(CLI::Range(1, 32));
  cmd->add_option("--dtype", opts->dtype, "Parameter and compute dtype")
      ->check(CLI::IsMember({"fp32", "bf16", "fp64"}));
  cmd->add_option("--device", opts->device, "auto: GPU when visible")->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  cmd->add_option("--workers", opts->workers, "Data loader threads")->check(CLI::Range(1, 256));
  cmd->callback([&ctx, opts] { ctx.action = [&ctx, opts] { return run_eval(*opts, ctx); }; });
}

}  // namespace vlatune::cli
