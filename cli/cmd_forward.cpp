// `vlatune forward`: one forward + loss on a fixed batch, for parity checks against other implementations.
#include <CLI/CLI.hpp>

#include <memory>

#include "cli/cli.h"

namespace vlatune::cli {

struct ForwardOptions {
  std::string config = "tiny";
  std::string weights;
  std::string batch;
  std::string dtype = "fp32";
  bool no_prune = false;
  bool no_trim = false;
  bool no_skip_dead = false;
  int action_dim = 32;
  std::string out;
};

static int run_forward(const ForwardOptions&) {
  throw Unavailable("forward: not available yet: the Pi0.5 model arrives with the model issue");
}

void setup_forward(CLI::App& app, Context& ctx) {
  auto opts = std::make_shared<ForwardOptions>();
  auto* cmd = app.add_subcommand("forward",
                                 "One forward + flow-matching loss on a fixed batch; prints "
                                 "{\"loss\": ...}");
  cmd->add_option("--config", opts->config, "Model size")->check(CLI::IsMember({"tiny", "full"}));
  cmd->add_option("--weights", opts->weights, "Model weights (safetensors)")->required()->check(CLI::ExistingFile);
  cmd->add_option("--batch", opts->batch, "Batch (safetensors; format in README)")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--dtype", opts->dtype, "Compute dtype")->check(CLI::IsMember({"fp32", "bf16"}));
  cmd->add_flag("--no-prune", opts->no_prune, "Keep camera slots that are masked for the whole batch");
  cmd->add_flag("--no-trim", opts->no_trim, "Keep text padding");
  cmd->add_flag("--no-skip-dead", opts->no_skip_dead, "Run the last layer's dead prefix work");
  cmd->add_option("--action-dim", opts->action_dim, "Loss over the first N action dims (LeRobot: real dims)")
      ->check(CLI::Range(1, 32));
  cmd->add_option("--out", opts->out, "Write loss, velocity and grad.<fqn> (safetensors)");
  cmd->callback([&ctx, opts] { ctx.action = [opts] { return run_forward(*opts); }; });
}

}  // namespace vlatune::cli
