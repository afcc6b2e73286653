// The GPUs `vlatune plan --gpu NAME` can plan for from a profile made on another one: their memory as the vendor
// states it and their compute capability (which features they have). Only bytes transfer between GPUs: the
// predicted peak is the same tensors on any GPU; the step time is the profiled GPU's (tuner/README.md).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "formats/profile.h"

namespace vlatune::tuner {

struct GpuSpec {
  std::string name;                       // as --gpu takes it, e.g. "RTX 4090"
  double memory_bytes = 0;                // the vendor's "24 GB" = 24e9 bytes
  formats::ComputeCapability capability;  // e.g. 8.9
};

// FP8 tensor-core GEMMs (the trainer's FP8 Linears) need compute capability 8.9 (Ada) or newer.
inline constexpr formats::ComputeCapability kFp8Capability{8, 9};
bool has_fp8(const formats::ComputeCapability& capability);

// Every GPU of the table, in the order --list-gpus prints them.
const std::vector<GpuSpec>& known_gpus();

// The GPU `name` names: case, spaces, '-' and '_' ignored and a leading "NVIDIA" dropped ("rtx4090", "a100-80gb").
// Throws PlanInputError naming --gpu and listing the known names.
const GpuSpec& find_gpu(const std::string& name);

// The table's GPU whose name a device name contains (environment.gpu, e.g. "NVIDIA A100-SXM4-80GB" -> A100-80GB),
// for profiles that record no compute capability; nothing when none or several different capabilities match.
std::optional<formats::ComputeCapability> capability_from_device_name(const std::string& device_name);

// The table as text: name, memory (GB and GiB), compute capability, FP8.
std::string format_gpu_table();

}  // namespace vlatune::tuner
