// `vlatune data synth|import`: LIBERO-shaped synthetic datasets and LIBERO HDF5 import.
#include <CLI/CLI.hpp>

#include <memory>

#include "cli/cli.h"

namespace vlatune::cli {

struct DataSynthOptions {
  std::string config = "tiny";
  int samples = 0;
  int seed = 0;
  std::string prompt_len = "20:199";
  std::string out;
};

struct DataImportOptions {
  std::string libero_dir;
  std::string tokenizer;
  std::string out;
};

static int run_data_synth(const DataSynthOptions&) {
  throw Unavailable("data synth: not available yet: datasets arrive with the trainer issue");
}

static int run_data_import(const DataImportOptions&) {
  throw Unavailable("data import: not available yet: LIBERO import arrives with the trainer issue");
}

void setup_data(CLI::App& app, Context& ctx) {
  auto* cmd = app.add_subcommand("data", "Make or import datasets");
  cmd->require_subcommand(1);

  auto synth = std::make_shared<DataSynthOptions>();
  auto* s = cmd->add_subcommand("synth", "LIBERO-shaped synthetic dataset (2 cameras, prompts, 50-step chunks)");
  s->add_option("--config", synth->config, "Model size")->check(CLI::IsMember({"tiny", "full"}));
  s->add_option("--samples", synth->samples, "Number of samples")->required()->check(CLI::Range(1, 1 << 30));
  s->add_option("--seed", synth->seed, "Random seed");
  s->add_option("--prompt-len", synth->prompt_len, "MIN:MAX real prompt tokens (padded to 200)");
  s->add_option("--out", synth->out, "Dataset directory")->required();
  s->callback([&ctx, synth] { ctx.action = [synth] { return run_data_synth(*synth); }; });

  auto imp = std::make_shared<DataImportOptions>();
  auto* i = cmd->add_subcommand("import", "Import LIBERO HDF5 demos into a packed dataset");
  i->add_option("--libero", imp->libero_dir, "Directory of LIBERO *.hdf5 files")
      ->required()
      ->check(CLI::ExistingDirectory);
  i->add_option("--tokenizer", imp->tokenizer, "SentencePiece model (PaliGemma tokenizer)")
      ->required()
      ->check(CLI::ExistingFile);
  i->add_option("--out", imp->out, "Dataset directory")->required();
  i->callback([&ctx, imp] { ctx.action = [imp] { return run_data_import(*imp); }; });
}

}  // namespace vlatune::cli
