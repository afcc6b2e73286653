// Flag values shared by the torch verbs (device, dtype), turned into torch types with errors that name the flag.
#pragma once

#include <torch/torch.h>

#include <string>

namespace vlatune::cli {

// trainer::resolve_device with its errors as BadInput: "auto" (cuda:0 when a GPU is visible, else CPU), "cpu"
// or "cuda".
torch::Device parse_device(const std::string& flag, const std::string& value);

// "fp32" | "bf16" | "fp64".
torch::Dtype parse_dtype(const std::string& flag, const std::string& value);

}  // namespace vlatune::cli
