// Resumable checkpoints: RUNDIR/checkpoints/step_<8 digits>/ holding
//   model.safetensors      every parameter under its openpi FQN (loadable by `--init-weights`)
//   optimizer.safetensors  AdamW moments (and fp32 master weights)          [OptimizerState::tensors]
//   ema.safetensors        EMA weights, when EMA is on
//   state.json             schema "vlatune.checkpoint/1": the step to run next, optimizer scalars, data
//                          position, schedule and run settings (whatever the trainer puts in `trainer_state`)
// Written atomically: everything goes into a hidden temporary directory, each file fsync'ed, then one rename()
// makes the checkpoint appear whole. A crash leaves either the previous set or the new one, never half of one.
// Only the newest `keep_last` checkpoints are kept.
#pragma once

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "trainer/optimizer.h"

namespace vlatune::trainer {

inline constexpr const char* kCheckpointSchema = "vlatune.checkpoint/1";

struct CheckpointContents {
  int64_t next_step = 0;                                    // the first step a resumed run executes
  OptimizerState optimizer;                                 // tensors + scalars + precision
  std::vector<std::pair<std::string, torch::Tensor>> ema;   // empty: no EMA
  nlohmann::json trainer_state = nlohmann::json::object();  // data position, schedule, settings, counters
};

// Writes checkpoint `contents.next_step` of `model` under run_dir/checkpoints and prunes older ones beyond
// `keep_last` (>= 1). Returns the checkpoint directory. Throws std::runtime_error naming the path on I/O errors.
std::string write_checkpoint(const std::string& run_dir, const torch::nn::Module& model,
                             const CheckpointContents& contents, int keep_last);

// The newest complete checkpoint directory of run_dir, if any.
std::optional<std::string> latest_checkpoint(const std::string& run_dir);

// Reads a checkpoint directory: loads model.safetensors into `model` (strict: every name and shape must match)
// and returns the rest. Tensors come back on the CPU. Errors name the file and the problem.
CheckpointContents read_checkpoint(const std::string& checkpoint_dir, torch::nn::Module& model);

// Checkpoint directories of run_dir, oldest first.
std::vector<std::string> list_checkpoints(const std::string& run_dir);

}  // namespace vlatune::trainer
