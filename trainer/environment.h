// The environment fingerprint stored in run.json: `vlatune check` refuses to compare runs whose GPU, driver,
// CUDA, torch, batch or recipe differ (timings do not carry across them).
#pragma once

#include <torch/torch.h>

#include <string>

#include "formats/run_record.h"

namespace vlatune::trainer {

// "auto" (the first GPU when one is visible, else the CPU), "cpu" or "cuda" (cuda:0). Throws
// std::invalid_argument naming `flag` for an unknown value, or for "cuda" when no GPU is visible.
torch::Device resolve_device(const std::string& flag, const std::string& choice);

// Makes the CPU run ATen's own kernels instead of oneDNN's. oneDNN's JIT convolution backward (SigLIP's patch
// embedding) was seen spinning without end in two-process CPU training, intermittently; ATen's convolution has no
// such barrier, and the CPU runs only the tiny config, where speed does not matter. Call once, before any op.
void use_aten_cpu_kernels();

// GPU name, driver and CUDA runtime versions of `device` (nulls on the CPU), torch version, vlatune commit.
// `config` and `recipe_hash` are the caller's.
formats::Environment capture_environment(torch::Device device, const std::string& config,
                                         const std::string& recipe_hash, int world_size);

// The vlatune commit this binary was configured from ("unknown" outside a git checkout); defined in the
// generated build_info.cpp (trainer/build_info.cpp.in).
const char* vlatune_commit();

// Peak bytes the caching allocator handed out on `device` since the last reset, in GiB (0 on the CPU).
double peak_allocated_gib(torch::Device device);
// Peak bytes it held from CUDA over the same span: the handed-out bytes plus its cached free blocks, which is what
// --max-memory caps (0 on the CPU).
double peak_reserved_gib(torch::Device device);
void reset_peak_allocated(torch::Device device);

}  // namespace vlatune::trainer
