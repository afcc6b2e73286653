// `vlatune launch --nproc N -- train ...`: one process per GPU on this host, torchrun-style environment.
#include <CLI/CLI.hpp>

#include <memory>

#include "cli/cli.h"

namespace vlatune::cli {

struct LaunchOptions {
  int nproc = 1;
  std::vector<std::string> command;
};

static int run_launch(const LaunchOptions&) {
  throw Unavailable("launch: not available yet: multi-GPU training arrives with the multi-GPU issue");
}

void setup_launch(CLI::App& app, Context& ctx) {
  auto opts = std::make_shared<LaunchOptions>();
  auto* cmd = app.add_subcommand("launch",
                                 "Run a vlatune verb on N local GPUs (sets RANK, LOCAL_RANK, "
                                 "WORLD_SIZE, MASTER_ADDR, MASTER_PORT)");
  cmd->add_option("--nproc", opts->nproc, "Processes (GPUs) on this host")->check(CLI::Range(1, 1024));
  cmd->add_option("command", opts->command, "The verb and its arguments, after --")->required();
  cmd->callback([&ctx, opts] { ctx.action = [opts] { return run_launch(*opts); }; });
}

}  // namespace vlatune::cli
