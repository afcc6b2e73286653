// `vlatune data synth|import`: LIBERO-shaped synthetic datasets and LIBERO HDF5 import (trainer/synthetic.h,
// trainer/libero_import.h). Parses and validates; the libraries do the work.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <tuple>
#include <vector>

#include <unistd.h>

#include "cli/cli.h"
#include "cli/torch_options.h"
#include "cli/validators.h"
#include "model/config.h"
#include "trainer/data_source.h"
#include "trainer/file_util.h"
#include "trainer/lerobot_import.h"
#include "trainer/libero_import.h"
#include "trainer/parquet_table.h"
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
  std::vector<std::string> lerobot_dirs;
  std::string tokenizer;
  std::string out;
  int64_t horizon = 50;
  bool discrete_state = false;
  // LeRobot only
  std::vector<std::string> cameras;
  std::string state_key, action_key, episodes, val_episodes;
  int64_t image_side = 224;
  int64_t workers = 0;
  double tolerance_s = 1e-4;
};

struct DataBenchOptions {
  std::string data;
  std::string config = "full";
  int64_t batch = 32;
  int64_t steps = 100;
  int workers = 4;
  std::string device = "auto";
};

namespace {

// A dataset is never written over another one (or over anything else): checked here so the user gets a
// bad-input exit before any work.
void require_fresh_output(const std::string& out) {
  if (!trainer::is_fresh_output(out))
    throw BadInput("--out " + out + ": exists and is not an empty directory (choose a new dataset directory)");
}

// Runs `write` into the fresh output directory `out`; when it fails, removes what it left there (partial shards of a
// full disk are no dataset), keeping the directory only when it existed before, as the user made it.
template <typename Write>
auto write_fresh_output(const std::string& out, Write write) {
  const bool existed = trainer::path_exists(out);
  try {
    return write();
  } catch (...) {
    try {
      trainer::remove_tree(out);
      if (existed) trainer::make_directories(out);
    } catch (const std::exception&) {
      // The error being reported matters more than the leftovers it names.
    }
    throw;
  }
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
    m = write_fresh_output(o.out, [&] { return trainer::write_synthetic_dataset(s); });
  } catch (const std::invalid_argument& e) {
    throw BadInput(e.what());
  }
  out << "wrote " << o.out << ": " << summary(m) << "\n";
  return kExitOk;
}

int run_data_import_lerobot(const DataImportOptions& o, std::ostream& out) {
  if (!trainer::lerobot_import_available())
    throw Unavailable("data import --lerobot: unavailable in this build: vlatune was built without " +
                      trainer::lerobot_import_missing() + "; install it and reconfigure");
  require_fresh_output(o.out);
  trainer::LeRobotImportOptions io;
  io.sources = o.lerobot_dirs;
  io.tokenizer_model = o.tokenizer;
  io.out = o.out;
  io.cameras = o.cameras;
  io.state_key = o.state_key;
  io.action_key = o.action_key;
  io.episodes = o.episodes;
  io.val_episodes = o.val_episodes;
  io.horizon = o.horizon;
  io.discrete_state = o.discrete_state;
  io.image_side = o.image_side;
  io.workers = o.workers;
  io.tolerance_s = o.tolerance_s;
  io.log = &out;
  io.progress_bar = ::isatty(STDOUT_FILENO) == 1;
  try {
    const auto r = write_fresh_output(o.out, [&] { return trainer::import_lerobot(io); });
    out << "dataset " << o.out << ": " << summary(r.train) << "\n";
    if (r.val.samples > 0) out << "dataset " << o.out << "/val: " << summary(r.val) << "\n";
    out << "norm stats: " << o.out << "/norm_stats.json (openpi's layout; also in the manifest)\n";
  } catch (const std::invalid_argument& e) {
    throw BadInput(e.what());
  } catch (const trainer::DataError& e) {
    throw BadInput(e.what());
  }
  return kExitOk;
}

int run_data_import(const DataImportOptions& o, std::ostream& out) {
  if (!o.lerobot_dirs.empty()) return run_data_import_lerobot(o, out);
  if (o.libero_dir.empty()) throw BadInput("data import: name the source with --lerobot DIR or --libero DIR");
  for (bool lerobot_only :
       {!o.cameras.empty(), !o.state_key.empty(), !o.action_key.empty(), !o.episodes.empty(), !o.val_episodes.empty()})
    if (lerobot_only)
      throw BadInput(
          "data import --libero: --camera, --state, --action, --episodes and --val-episodes go with --lerobot");
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
    const auto report = write_fresh_output(o.out, [&] { return trainer::import_libero(io); });
    out << "dataset " << o.out << ": " << summary(report.manifest) << "\n";
  } catch (const std::invalid_argument& e) {
    throw BadInput(e.what());
  }
  return kExitOk;
}

// The loader alone, as `vlatune train` runs it (same workers, pinned slots, device copy and preprocessing), with
// nothing else using the host or the device: the most samples/s the data side can feed a run.
int run_data_bench(const DataBenchOptions& o, std::ostream& out) {
  const auto device = parse_device("--device", o.device);
  const auto cfg = model::Pi05Config::named(o.config);
  trainer::LoaderOptions lo;
  lo.workers = o.workers;
  std::unique_ptr<trainer::DataSource> source;
  try {
    source = trainer::open_data_source(o.data, cfg, o.batch, 0, device, lo);
  } catch (const std::invalid_argument& e) {
    throw BadInput(std::string("--data: ") + e.what());
  }
  out << "bench: " << source->describe() << ", batch " << o.batch << ", " << o.workers << " workers\n";
  auto sync = [&] {
    if (device.is_cuda()) torch::cuda::synchronize();
  };
  const int64_t warmup = std::min<int64_t>(5, o.steps);
  std::vector<double> waits;
  for (int64_t s = 0; s < warmup; ++s) source->next(s, nullptr);
  sync();
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t s = warmup; s < warmup + o.steps; ++s) {
    double wait = 0;
    const auto batch = source->next(s, &wait);
    waits.push_back(wait);
  }
  sync();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::sort(waits.begin(), waits.end());
  char line[200];
  std::snprintf(
      line, sizeof(line),
      "bench: %lld batches in %.2f s: %.1f samples/s (%.1f batches/s); wait per batch median %.2f ms, max %.2f ms\n",
      static_cast<long long>(o.steps), seconds, static_cast<double>(o.steps * o.batch) / seconds,
      static_cast<double>(o.steps) / seconds, waits[waits.size() / 2], waits.back());
  out << line;
  return kExitOk;
}

}  // namespace

void setup_data(CLI::App& app, Context& ctx) {
  auto* cmd = app.add_subcommand("data", "Make or import datasets");
  cmd->require_subcommand(1);

  auto synth = std::make_shared<DataSynthOptions>();
  auto* s = cmd->add_subcommand("synth", "LIBERO-shaped synthetic dataset (2 cameras, prompts, action chunks)");
  s->option_defaults()->always_capture_default();
  s->add_option("--config", synth->config, "Model size (sets the stored image side: tiny 28, full 224)")
      ->check(CLI::IsMember({"tiny", "full"}));
  s->add_option("--samples", synth->samples, "Number of samples")->required()->check(CLI::Range(1, 1 << 30));
  s->add_option("--seed", synth->seed, "Random seed (same seed, same bytes)")->check(unsigned_integer());
  s->add_option("--prompt-len", synth->prompt_len, "MIN:MAX real prompt tokens (padded to 200)");
  s->add_option("--horizon", synth->horizon, "Action chunk length")->check(CLI::Range(1, 4096));
  s->add_option("--out", synth->out, "Dataset directory (new or empty)")->required();
  s->callback([&ctx, synth] { ctx.action = [&ctx, synth] { return run_data_synth(*synth, ctx.out); }; });

  auto imp = std::make_shared<DataImportOptions>();
  auto* i = cmd->add_subcommand("import",
                                "Import LeRobot datasets (v2.0/v2.1/v3.0) or LIBERO HDF5 demos into a packed dataset");
  auto* lerobot = i->add_option("--lerobot", imp->lerobot_dirs,
                                "LeRobot dataset directory (meta/info.json inside); repeat to merge datasets with "
                                "matching features (this or --libero is required)")
                      ->check(CLI::ExistingDirectory);
  i->add_option("--libero", imp->libero_dir,
                "Directory of LIBERO *.hdf5 files, searched recursively (this or --lerobot is required)")
      ->check(CLI::ExistingDirectory)
      ->excludes(lerobot);
  i->add_option("--camera", imp->cameras,
                "LeRobot: camera feature, repeat in slot order (base, left wrist, right wrist) [default: every "
                "image/video feature, info.json order]");
  i->add_option("--state", imp->state_key, "LeRobot: state feature [default: observation.state or state]");
  i->add_option("--action", imp->action_key, "LeRobot: action feature [default: action or actions]");
  i->add_option("--episodes", imp->episodes,
                "LeRobot: episodes to import, numbered 0.. across the sources: A:B (half-open), a list 3,7,9, or "
                "both [default: all]");
  i->add_option("--val-episodes", imp->val_episodes,
                "LeRobot: hold episodes out into OUT/val: N (the last N selected) or indices as --episodes "
                "[default: none]");
  i->add_option("--image-side", imp->image_side,
                "LeRobot: stored image side, after openpi's resize_with_pad (tiny config: 28)")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  i->add_option("--workers", imp->workers, "LeRobot: decoding threads [default: one per hardware thread]")
      ->check(CLI::Range(1, 1024));
  i->add_option("--tolerance", imp->tolerance_s,
                "LeRobot: seconds a video frame's timestamp may differ from the frame's (LeRobot's default)")
      ->capture_default_str()
      ->check(finite_range(1e-9, 1.0));
  i->add_option("--tokenizer", imp->tokenizer, "SentencePiece model (PaliGemma tokenizer)")
      ->required()
      ->check(regular_file());
  i->add_option("--out", imp->out, "Dataset directory (new or empty)")->required();
  i->add_option("--horizon", imp->horizon, "Action chunk length (past an episode's end the last action repeats)")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  i->add_flag("--discrete-state", imp->discrete_state,
              "Prompts carry the 256-bin state: \"Task: ..., State: ...;\\nAction: \" (spec §4.6)");
  i->callback([&ctx, imp] { ctx.action = [&ctx, imp] { return run_data_import(*imp, ctx.out); }; });

  auto bench = std::make_shared<DataBenchOptions>();
  auto* b = cmd->add_subcommand("bench", "Measure the data loader alone: samples/s it can feed a run");
  b->add_option("--data", bench->data, "Dataset directory")->required()->check(CLI::ExistingDirectory);
  b->add_option("--config", bench->config, "Model size (the image side it resizes to)")
      ->capture_default_str()
      ->check(CLI::IsMember({"tiny", "full"}));
  b->add_option("--batch", bench->batch, "Samples per batch")->capture_default_str()->check(CLI::Range(1, 1 << 16));
  b->add_option("--steps", bench->steps, "Timed batches (after 5 untimed)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  b->add_option("--workers", bench->workers, "Loader threads (as train --workers)")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  b->add_option("--device", bench->device, "auto: the GPU when visible")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  b->callback([&ctx, bench] { ctx.action = [&ctx, bench] { return run_data_bench(*bench, ctx.out); }; });
}

}  // namespace vlatune::cli
