// train_config.json: the settings a `vlatune train` run was started with, in its run directory, so that
// `--resume` continues with exactly them (the recipe is the run's own RUNDIR/recipe.json, written beside it).
//
//   {"schema": "vlatune.train_config/2", "run_id": "9f3c0a1b2c3d4e5f",
//    "config": "full", "data": "/data/libero", "recipe_source": "/home/u/recipes/pi05_libero_h200_fp8.json",
//    "init_weights": null, "device": "auto", "steps": 30000,
//    "lr": 5e-05, "warmup_steps": 10000, "decay_steps": 1000000, "decay_lr": 5e-05, "clip_norm": 1.0,
//    "weight_decay": 1e-10, "beta1": 0.9, "beta2": 0.95, "eps": 1e-08, "ema_decay": 0.0, "loss_action_dim": 32,
//    "seed": 42, "timing_warmup": 3, "checkpoint_every": 1000, "keep_last": 3, "max_consecutive_nonfinite": 10,
//    "workers": 4, "augment": false, "save": true, "world_size": 1, "dist_buckets": "groups"}
//
// Every key is required (the file is machine-written), unknown keys are refused, and every value is range-checked;
// errors name the file and the JSON path. Paths (data, recipe_source, init_weights) are written absolute; a
// relative one is read as relative to the run directory (resolve_run_path), so a run resumes from any working
// directory and a run directory moved together with its dataset still resumes.
// run_id identifies the run: every checkpoint it writes carries it (formats/checkpoint_state.h), and a run only
// resumes from, or prunes, checkpoints that carry its own.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace vlatune::formats {

inline constexpr const char* kTrainConfigSchema = "vlatune.train_config/2";

struct TrainConfig {
  std::string run_id;                        // 16 lowercase hex digits
  std::string config;                        // "tiny" | "full"
  std::string data;                          // "synthetic" or the dataset directory
  std::optional<std::string> recipe_source;  // the --recipe the run started from (provenance); null: none
  std::optional<std::string> init_weights;   // --init-weights; null: none
  std::string device;                        // "auto" | "cpu" | "cuda"
  int64_t steps = 1;                         // total optimizer steps, >= 1
  double lr = 0;                             // peak learning rate, finite >= 0
  int64_t warmup_steps = 0;                  // >= 0
  int64_t decay_steps = 1;                   // >= 1
  double decay_lr = 0;                       // finite >= 0
  double clip_norm = 0;                      // finite >= 0; 0: off
  double weight_decay = 0;                   // finite >= 0
  double beta1 = 0, beta2 = 0;               // in [0, 1)
  double eps = 0;                            // finite > 0
  double ema_decay = 0;                      // in [0, 1); 0: off
  int64_t loss_action_dim = 32;              // 1..32
  uint64_t seed = 0;
  int64_t timing_warmup = 0;              // >= 0
  int64_t checkpoint_every = 0;           // >= 0; 0: only the final checkpoint
  int64_t keep_last = 1;                  // 1..1000
  int64_t max_consecutive_nonfinite = 1;  // >= 1
  int64_t workers = 1;                    // 1..256
  bool augment = false;
  bool save = true;          // false: --no-save (no checkpoints, nothing to resume)
  int64_t world_size = 1;    // processes of the run's latest segment, >= 1
  std::string dist_buckets;  // "groups" | "one"
};

bool operator==(const TrainConfig& a, const TrainConfig& b);

TrainConfig parse_train_config(const nlohmann::json& j, const std::string& file);
TrainConfig read_train_config(const std::string& path);
nlohmann::json train_config_to_json(const TrainConfig& config);
// Validates (as the reader would, so what is written always reads back) and writes atomically.
void write_train_config(const TrainConfig& config, const std::string& path);

// `path` as stored in a run directory's files: absolute paths as they are, relative ones below `run_dir`.
std::string resolve_run_path(const std::string& run_dir, const std::string& path);

}  // namespace vlatune::formats
