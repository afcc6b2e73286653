// One training batch as the model consumes it (already preprocessed: images in [-1, 1], tokens padded,
// actions normalized and zero-padded to 32 dims), with the flow-matching noise and time drawn by the caller so
// that runs are reproducible and shortcuts can be compared on the same draw.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include <torch/torch.h>

#include "model/config.h"

namespace vlatune::model {

struct Pi05Batch {
  torch::Tensor images;       // [B, slots, 3, side, side] float in [-1, 1]
  torch::Tensor image_masks;  // [B, slots] bool
  torch::Tensor tokens;       // [B, L] int64 (padding id 0)
  torch::Tensor token_masks;  // [B, L] bool (true on real tokens, right padding)
  torch::Tensor actions;      // [B, H, action_dim] float (normalized, zero-padded)
  torch::Tensor noise;        // [B, H, action_dim] float
  torch::Tensor time;         // [B] float in [0.001, 1]
  // What the exact shortcuts read from the masks (apply_input_shortcuts), where the batch's maker knows it on the
  // host (a loader knows its cameras and prompt lengths before it copies them): the shortcuts then read no mask
  // back from the device, so a step can be queued while the previous one still runs. Each must equal what the
  // masks say; unset: the masks are read.
  std::optional<std::vector<bool>> used_slots;  // per slot: image_masks[:, s].any()
  std::optional<int64_t> text_used;             // the last true column of token_masks + 1 (0: none)
  // The valid entries' counts (ForwardOptions::skip_padded_rows sizes the prefix stream's rows from them).
  std::optional<int64_t> valid_images;  // image_masks.sum()
  std::optional<int64_t> valid_tokens;  // token_masks.sum()
};

// Every tensor of the batch, in declaration order, for code that treats them alike (moves, copies, shape keys).
std::array<torch::Tensor*, 7> batch_tensors(Pi05Batch& b);
std::array<const torch::Tensor*, 7> batch_tensors(const Pi05Batch& b);

// Random LIBERO-shaped batch: images uniform in [-1, 1]; the first `valid_slots` cameras valid, the rest masked
// (images -1); prompts of length uniform in [min_prompt, max_prompt] with tokens uniform in [1, vocab), right-
// padded with 0 / mask false up to text_len; actions uniform in [-1, 1]; noise ~ N(0, 1);
// time = 0.999 * Beta(1.5, 1) + 0.001, sampled as U^(1/1.5). Drawn on the CPU from `generator` (nullptr: the
// default CPU generator), then moved to `device`. Throws std::invalid_argument on inconsistent sizes.
Pi05Batch make_random_batch(const Pi05Config& cfg, int64_t batch, int64_t slots, int64_t valid_slots, int64_t text_len,
                            int64_t min_prompt, int64_t max_prompt, int64_t horizon, torch::Generator* generator,
                            torch::Device device);

// The same batch with its floating-point tensors (images, actions, noise, time) cast to `dtype`.
Pi05Batch batch_to(const Pi05Batch& batch, c10::ScalarType dtype);

}  // namespace vlatune::model
