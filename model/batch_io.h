// The batch file of `vlatune forward` and `vlatune model batch`: one Pi05Batch as safetensors, for parity
// checks against other implementations (format documented in the README):
//   images [B, slots, 3, side, side] float in [-1, 1]   image_masks [B, slots] U8|BOOL
//   tokens [B, L] I64|I32                               token_masks [B, L] U8|BOOL
//   actions [B, H, 32] float   noise [B, H, 32] float   time [B] float
#pragma once

#include <string>

#include "model/batch.h"
#include "model/config.h"

namespace vlatune::model {

// Reads and validates a batch file against `cfg` (image side, action dim, vocab): every tensor present, dtypes
// and shapes consistent, masks 0/1, tokens in [0, vocab). Errors name the file, the tensor, expected and actual.
// Floats come back as fp32, masks as bool, tokens as int64, on the CPU.
Pi05Batch read_batch(const std::string& path, const Pi05Config& cfg);

// The observation part of a batch file, for sampling: images, image_masks, tokens and token_masks checked as
// read_batch checks them; noise (and actions, time) only when the file has them (undefined otherwise), checked
// the same way when present.
Pi05Batch read_observation_batch(const std::string& path, const Pi05Config& cfg);

// Writes `batch` (floats as F32, masks as BOOL, tokens as I64) atomically.
void write_batch(const std::string& path, const Pi05Batch& batch);

}  // namespace vlatune::model
