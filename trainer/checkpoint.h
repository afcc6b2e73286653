// Resumable checkpoints: RUNDIR/checkpoints/step_<8 digits>/ holding
//   model.safetensors      every parameter under its openpi FQN (loadable by `--init-weights`); with LoRA also the
//                          adapters (`<linear>.lora_A`, `.lora_B`, model/lora.h) beside the unmerged base weights,
//                          which `--init-weights` reports as unexpected and skips: final/ holds the merged form
//   optimizer.safetensors  AdamW moments (and fp32 master weights)          [OptimizerState::tensors]
//   ema.safetensors        EMA weights, when EMA is on
//   state.json             formats/checkpoint_state.h: the run that wrote it, the step to run next, optimizer
//                          scalars, data position, schedule, and the XXH64 of each tensor file
// Written atomically: everything goes into a hidden temporary directory (.step_<8 digits>.tmp), each file fsync'ed,
// then one rename() makes the checkpoint appear whole. A crash leaves either the previous set or the new one, never
// half of one; the temporary directory it leaves is removed when the run resumes.
// Pruning removes only checkpoints that carry the run's own run_id, and of them only the files their state.json
// names: never another run's data, never through a symbolic link. A checkpoint is renamed back to a temporary
// name before its files go, so one half removed is never taken for a checkpoint.
#pragma once

#include <torch/torch.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "formats/checkpoint_state.h"
#include "trainer/optimizer.h"

namespace vlatune::trainer {

struct CheckpointContents {
  OptimizerState optimizer;                                // tensors + scalars + precision
  std::vector<std::pair<std::string, torch::Tensor>> ema;  // empty: no EMA
  // run_id, next_step and the trainer's fields; write_checkpoint fills optimizer, ema and files from the above.
  formats::CheckpointState state;
};

// Writes checkpoint `contents.state.next_step` of `model` under run_dir/checkpoints (replacing one of the same step
// that the same run wrote) and returns its directory. Throws std::runtime_error naming the path on I/O errors.
std::string write_checkpoint(const std::string& run_dir, const torch::nn::Module& model,
                             const CheckpointContents& contents);

// Removes the oldest checkpoints of run `run_id` beyond the newest `keep_last` (>= 1). A removal that fails is not
// an error: it comes back as a warning line naming the path and the reason.
std::vector<std::string> prune_checkpoints(const std::string& run_dir, const std::string& run_id, int keep_last);

// Removes a checkpoint's temporary directory (.step_N.tmp being written, .step_N.removing.tmp being removed): the
// files a checkpoint write makes and their temporaries, then the directory; anything else in it is left in place
// with the directory. Returns one warning line per failure (none: the directory is gone).
std::vector<std::string> remove_checkpoint_temporary(const std::string& dir);

// Checkpoint directories of run_dir (step_<8 digits> directories, not links, holding a state.json), oldest first.
std::vector<std::string> list_checkpoints(const std::string& run_dir);
// The newest of them, if any.
std::optional<std::string> latest_checkpoint(const std::string& run_dir);

// Reads a checkpoint directory: state.json (strict, then checked against `expected`), the checksum of every tensor
// file, then model.safetensors into `model` (strict: every name and shape must match) and the rest. Tensors come
// back on the CPU. Errors: formats::FormatError naming the file and what is wrong.
CheckpointContents read_checkpoint(const std::string& checkpoint_dir, torch::nn::Module& model,
                                   const formats::CheckpointExpectations& expected);

// "xxh64:<16 hex digits>" of a file's bytes (trainer/checksum.h). Throws std::runtime_error naming the file.
std::string file_checksum(const std::string& path);

}  // namespace vlatune::trainer
