// `vlatune train`: the built-in Pi0.5 trainer, configured by a recipe.
#include <CLI/CLI.hpp>

#include <memory>

#include "cli/cli.h"

namespace vlatune::cli {

struct TrainOptions {
  std::string config = "tiny";
  std::string data = "synthetic";
  int steps = 0;
  int batch = 32;
  std::string out;
  std::string recipe;
  std::string resume;
  std::string init_weights;
  double lr = 0;
};

static int run_train(const TrainOptions&) {
  throw Unavailable("train: not available yet: the trainer arrives with the trainer issue");
}

void setup_train(CLI::App& app, Context& ctx) {
  auto opts = std::make_shared<TrainOptions>();
  auto* cmd = app.add_subcommand("train",
                                 "Train Pi0.5 with a recipe -> RUNDIR/{metrics.jsonl, run.json, "
                                 "checkpoints}");
  cmd->add_option("--config", opts->config, "Model size")->check(CLI::IsMember({"tiny", "full"}));
  cmd->add_option("--data", opts->data, "Dataset directory, or 'synthetic' (batches made on the GPU)");
  cmd->add_option("--steps", opts->steps, "Total optimizer steps")->check(CLI::Range(1, 1 << 30));
  cmd->add_option("--batch", opts->batch, "Micro-batch size")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--out", opts->out, "Run directory");
  cmd->add_option("--recipe", opts->recipe, "recipe.json (flags override it)")->check(CLI::ExistingFile);
  cmd->add_option("--resume", opts->resume, "Continue the run in RUNDIR")->check(CLI::ExistingDirectory);
  cmd->add_option("--init-weights", opts->init_weights, "openpi/LeRobot-named safetensors to start from")
      ->check(CLI::ExistingFile);
  cmd->add_option("--lr", opts->lr, "Peak learning rate")->check(CLI::PositiveNumber);
  cmd->callback([&ctx, opts] { ctx.action = [opts] { return run_train(*opts); }; });
}

}  // namespace vlatune::cli
