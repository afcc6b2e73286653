// The settings a `vlatune train` run runs with, before anything is built: a new run's, from the caller's options
// (paths made absolute, unset bookkeeping values their defaults), or a resumed run's own, from its
// train_config.json and recipe.json, with the caller's new --steps and bookkeeping values. For a resumed run also
// where it starts (the newest of its own checkpoints, or step 0), refusing a finished run, --steps at or below the
// step reached, a schedule that cannot run, and another world size that cannot keep the global batch. Every rank
// of a job makes these checks
// alike (read-only); nothing is written here.
#pragma once

#include <optional>
#include <ostream>
#include <string>

#include "formats/recipe.h"
#include "formats/train_config.h"
#include "trainer/train_loop.h"

namespace vlatune::trainer {

struct RunSettings {
  bool resuming = false;
  std::string run_dir;
  formats::TrainConfig config;             // train_config.json (its `config` resolved once the device is known)
  formats::Recipe recipe;                  // --recipe (or the default), or the resumed run's own recipe.json
  std::string recipe_label;                // names the recipe in errors
  std::optional<std::string> resume_from;  // the checkpoint a resumed run starts from; unset: step 0
  TrainOptions options;                    // the settings as build_training_parts takes them
};

// `world_size`: processes of this run. Bad options or inputs: TrainInputError, formats::FormatError.
RunSettings run_settings(const TrainOptions& caller, int world_size, std::ostream& log);

}  // namespace vlatune::trainer
