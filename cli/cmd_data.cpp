// `vlatune data synth|import`: LIBERO-shaped synthetic datasets and LIBERO HDF5 import (trainer/synthetic.h,
// trainer/libero_import.h). Parses and validates; the libraries do the work.
#include <CLI/CLI.hpp>

#include <memory>
#include <stdexcept>
#include <tuple>

#include "cli/cli.h"
#include "trainer/file_util.h"
#include "trainer/libero_import.h"
#include "trainer/synthetic.h"

namespace vlatune::cli {

struct DataSynthOptions {
  std::string config = "tiny";
  int64_t samples = 0;
  uint64_t seed = 0;
  std::string prompt_len = "20:199";
  int64_t horizon = 50;
  std::string out;
};

struct DataImportOptions {
  std::string libero_dir;
  std::string tokenizer;
  std::string out;
  int64_t horizon = 50;
  bool discrete_state = false;
};

namespace {

// A dataset is never written over another one (or over anything else): checked here so the user gets a
// bad-input exit before any work.
void require_fresh_output(const std::string& out) {
  if (!trainer::is_fresh_output(out))
    throw BadInput("--out " + out + ": exists and is not an empty directory (choose a new dataset directory)");
}

std::string summary(const trainer::DatasetManifest& m) {
  int64_t bytes = 0;
  for (const auto& s : m.shards) bytes += s.bytes;
  return std::to_string(m.samples) + " samples, " + std::to_string(m.shards.size()) + " shard(s), " +
         std::to_string(bytes / (1 << 20)) + " MiB, images " + std::to_string(m.layout.image_side) + " px, horizon " +
         std::to_string(m.layout.horizon);
}

int run_data_synth(const DataSynthOptions& o, std::ostream& out) {
  trainer::SynthOptions s;
  s.config = o.config;
  s.samples = o.samples;
  s.seed = o.seed;
  s.horizon = o.horizon;
  s.out = o.out;
  try {
    std::tie(s.min_prompt, s.max_prompt) = trainer::parse_prompt_range(o.prompt_len);
  } catch (const std::invalid_argument& e) {
    throw BadInput(std::string("--prompt-len: ") + e.what());
  }
  require_fresh_output(o.out);
  trainer::DatasetManifest m;
  try {
    m = trainer::write_synthetic_dataset(s);
  } catch (const std::invalid_argument& e) {
    throw BadInput(e.what());
  }
  out << "wrote " << o.out << ": " << summary(m) << "\n";
  return kExitOk;
}

int run_data_import(const DataImportOptions& o, std::ostream& out) {
  if (!trainer::libero_import_available())
    throw Unavailable("data import: unavailable in this build: vlatune was built without " +
                      trainer::libero_import_missing() + "; install it and reconfigure");
  require_fresh_output(o.out);
  trainer::LiberoImportOptions io;
  io.libero_dir = o.libero_dir;
  io.tokenizer_model = o.tokenizer;
  io.out = o.out;
  io.horizon = o.horizon;
  io.discrete_state = o.discrete_state;
  io.log = &out;
  try {
    const auto report = trainer::import_libero(io);
    out << "dataset " << o.out << ": " << summary(report.manifest) << "\n";
  } catch (const std::invalid_argument& e) {
    throw BadInput(e.what());
  }
  return kExitOk;
}

}  // namespace

void setup_data(CLI::App& app, Context& ctx) {
  auto* cmd = app.add_subcommand("data", "Make or import datasets");
  cmd->require_subcommand(1);

  auto synth = std::make_shared<DataSynthOptions>();
  auto* s = cmd->add_subcommand("synth", "LIBERO-shaped synthetic dataset (2 cameras, prompts, action chunks)");
  s->add_option("--config", synth->config, "Model size (sets the stored image side: tiny 28, full 224)")
      ->check(CLI::IsMember({"tiny", "full"}));
  s->add_option("--samples", synth->samples, "Number of samples")->required()->check(CLI::Range(1, 1 << 30));
  s->add_option("--seed", synth->seed, "Random seed (same seed, same bytes)");
  s->add_option("--prompt-len", synth->prompt_len, "MIN:MAX real prompt tokens (padded to 200)");
  s->add_option("--horizon", synth->horizon, "Action chunk length")->check(CLI::Range(1, 4096));
  s->add_option("--out", synth->out, "Dataset directory (new or empty)")->required();
  s->callback([&ctx, synth] { ctx.action = [&ctx, synth] { return run_data_synth(*synth, ctx.out); }; });

  auto imp = std::make_shared<DataImportOptions>();
  auto* i = cmd->add_subcommand("import", "Import LIBERO HDF5 demos into a packed dataset");
  i->add_option("--libero", imp->libero_dir, "Directory of LIBERO *.hdf5 files (searched recursively)")
      ->required()
      ->check(CLI::ExistingDirectory);
  i->add_option("--tokenizer", imp->tokenizer, "SentencePiece model (PaliGemma tokenizer)")
      ->required()
      ->check(CLI::ExistingFile);
  i->add_option("--out", imp->out, "Dataset directory (new or empty)")->required();
  i->add_option("--horizon", imp->horizon, "Action chunk length (past an episode's end the last action repeats)")
      ->check(CLI::Range(1, 4096));
  i->add_flag("--discrete-state", imp->discrete_state,
              "Prompts carry the 256-bin state: \"Task: ..., State: ...;\\nAction: \" (spec §4.6)");
  i->callback([&ctx, imp] { ctx.action = [&ctx, imp] { return run_data_import(*imp, ctx.out); }; });
}

}  // namespace vlatune::cli
