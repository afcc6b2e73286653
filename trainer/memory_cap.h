// `vlatune train --max-memory GiB`: a cap on the CUDA caching allocator, so that a plan for a smaller GPU can be
// rehearsed on a bigger one, and the message an out-of-memory failure gets (the recipe's predicted peak and the
// budget it was planned for, instead of the allocator's bare error).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>

#include "formats/recipe.h"

namespace vlatune::trainer {

// Caps the caching allocator of `device` at `gib` GiB (setMemoryFraction of the GPU's total memory): an
// allocation beyond it fails as the GPU's own out-of-memory would. Throws TrainInputError for a value that is not
// finite, not > 0 or above the GPU's memory. On the CPU the cap has no effect: it is accepted and the log says so
// (a CPU rehearsal of a GPU command line keeps working).
void apply_memory_cap(const torch::Device& device, std::optional<double> gib, std::ostream& log);

// The message of a run that ran out of device memory `where` (e.g. "in the first step"): the cap when one was set,
// the recipe's predicted peak and the budget its plan used (its "memory budget" rationale), and what to do next.
// `allocator_error` is the allocator's text (its first line is kept).
std::string out_of_memory_message(const std::string& where, int64_t micro_batch, int64_t grad_accum,
                                  std::optional<double> cap_gib, const formats::Recipe& recipe,
                                  const std::string& recipe_label, const std::string& allocator_error);

}  // namespace vlatune::trainer
