// What `sample`, `eval` and `serve` share: the trained policy they load. WEIGHTS is a safetensors file (openpi or
// LeRobot names) or a directory holding model.safetensors (a run's final/), whose norm_stats.json is then the
// default norm stats.
#pragma once

#include <string>

#include <torch/torch.h>

#include "model/pi05.h"
#include "trainer/norm_stats.h"

namespace vlatune::cli {

// The weights file WEIGHTS names (BadInput when neither a file nor a directory with model.safetensors).
std::string weights_file(const std::string& weights);

// The model size of --config: the flag's value, or (empty) full on a GPU and tiny on the CPU.
std::string policy_config_name(const std::string& flag, torch::Device device);

// WEIGHTS/norm_stats.json when WEIGHTS is a directory holding one, else "".
std::string default_norm_stats(const std::string& weights);

// The model on `device` in `dtype`: WEIGHTS loaded strictly, or (WEIGHTS empty) random weights from `seed`; its
// merged GEMMs' weights packed (Pi05Impl::pack_merged_weights). Load errors are BadInput naming the file.
model::Pi05 load_policy_model(const model::Pi05Config& cfg, const std::string& weights, uint64_t seed,
                              torch::Device device, torch::Dtype dtype);

// read_norm_stats_file with its errors as BadInput; `flag` names the option in the message.
trainer::NormStats read_norm_stats_flag(const std::string& flag, const std::string& path);

}  // namespace vlatune::cli
