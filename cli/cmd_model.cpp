// `vlatune model init`: randomly initialized Pi0.5 weights under the openpi names.
#include <CLI/CLI.hpp>

#include <memory>

#include "cli/cli.h"

namespace vlatune::cli {

struct ModelInitOptions {
  std::string config = "tiny";
  int64_t seed = 0;
  std::string out;
};

static int run_model_init(const ModelInitOptions&) {
  throw Unavailable("model init: not available yet: the Pi0.5 model arrives with the model issue");
}

void setup_model(CLI::App& app, Context& ctx) {
  auto* cmd = app.add_subcommand("model", "Model utilities");
  cmd->require_subcommand(1);
  auto opts = std::make_shared<ModelInitOptions>();
  auto* init = cmd->add_subcommand("init", "Write randomly initialized weights (openpi names) to safetensors");
  init->add_option("--config", opts->config, "Model size")->check(CLI::IsMember({"tiny", "full"}));
  init->add_option("--seed", opts->seed, "Random seed");
  init->add_option("--out", opts->out, "Weights file (.safetensors)")->required();
  init->callback([&ctx, opts] { ctx.action = [opts] { return run_model_init(*opts); }; });
}

}  // namespace vlatune::cli
