// state.json of a checkpoint (RUNDIR/checkpoints/step_<8 digits>/state.json, trainer/checkpoint.h): everything
// of the checkpoint that is not a tensor, and a checksum of each tensor file.
//
//   {"schema": "vlatune.checkpoint/2", "run_id": "9f3c0a1b2c3d4e5f", "next_step": 2000,
//    "optimizer": {"precision": "bf16", "scalars": {"step": 2000, "skipped_steps": 0, "beta1": 0.9, ...}},
//    "ema": false,
//    "trainer": {"skipped_steps": 0, "data_fingerprint": "xxh64:...", "seed": 42, "lr_next": 5e-05},
//    "files": {"model.safetensors": "xxh64:0123456789abcdef", "optimizer.safetensors": "xxh64:..."}}
//
// Strict: unknown keys refused, every key required, values range-checked (parse_checkpoint_state), and then
// checked against the run that resumes from it (check_checkpoint_state): its run_id, seed, precision, EMA and
// step count. `files` names exactly the tensor files of the checkpoint (model and optimizer, plus ema when on;
// no other name is accepted, so the names can never point outside the checkpoint directory); the XXH64 of each
// (trainer/checksum.h, the dataset's checksum) is verified before anything is loaded.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace vlatune::formats {

inline constexpr const char* kCheckpointSchema = "vlatune.checkpoint/2";

struct CheckpointState {
  std::string run_id;                               // the run that wrote it (train_config.json's run_id)
  int64_t next_step = 0;                            // the first step a resumed run executes, >= 0
  std::string optimizer_precision;                  // "bf16" | "fp32-master"
  std::map<std::string, double> optimizer_scalars;  // finite; "step" and "skipped_steps" in 0..next_step
  bool ema = false;                                 // ema.safetensors present
  int64_t skipped_steps = 0;                        // steps skipped for non-finite values, 0..next_step
  std::string data_fingerprint;                     // DataPosition::fingerprint, non-empty
  uint64_t seed = 0;
  double lr_next = 0;                        // the learning rate of next_step, finite >= 0
  std::map<std::string, std::string> files;  // tensor file name -> "xxh64:<16 hex digits>"
};

bool operator==(const CheckpointState& a, const CheckpointState& b);

// The tensor files a checkpoint holds: model.safetensors, optimizer.safetensors, and ema.safetensors with EMA.
std::vector<std::string> checkpoint_tensor_files(bool ema);

CheckpointState parse_checkpoint_state(const nlohmann::json& j, const std::string& file);
CheckpointState read_checkpoint_state(const std::string& path);
nlohmann::json checkpoint_state_to_json(const CheckpointState& state);

// What the run resuming from a checkpoint expects of it.
struct CheckpointExpectations {
  std::string run_id;
  int64_t max_next_step = 0;  // the run's total steps
  uint64_t seed = 0;
  std::string optimizer_precision;
  bool ema = false;
};
// FormatError(file, JSON path, what differs) when the state does not belong to, or does not fit, the run.
void check_checkpoint_state(const CheckpointState& state, const std::string& file,
                            const CheckpointExpectations& expected);

}  // namespace vlatune::formats
