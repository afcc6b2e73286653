#include "cli/policy_options.h"

#include <sys/stat.h>

#include "cli/cli.h"
#include "formats/json_error.h"
#include "model/state_dict.h"

namespace vlatune::cli {

namespace {

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool is_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

}  // namespace

std::string weights_file(const std::string& weights) {
  if (is_file(weights)) return weights;
  if (is_directory(weights)) {
    const std::string inside = weights + "/model.safetensors";
    if (is_file(inside)) return inside;
    throw BadInput("--weights " + weights + ": a directory without model.safetensors (expected a run's final/)");
  }
  throw BadInput("--weights " + weights + ": no such file or directory");
}

std::string policy_config_name(const std::string& flag, torch::Device device) {
  if (!flag.empty()) return flag;
  return device.is_cuda() ? "full" : "tiny";
}

std::string default_norm_stats(const std::string& weights) {
  const std::string inside = weights + "/norm_stats.json";
  return is_directory(weights) && is_file(inside) ? inside : std::string();
}

model::Pi05 load_policy_model(const model::Pi05Config& cfg, const std::string& weights, uint64_t seed,
                              torch::Device device, torch::Dtype dtype) {
  model::Pi05 net(cfg, device, dtype);
  if (weights.empty()) {
    model::init_weights(*net, seed);
  } else {
    const std::string file = weights_file(weights);
    try {
      model::load_state_dict(*net, file, /*strict=*/true);
    } catch (const model::SafetensorsError& e) {
      throw BadInput(std::string("--weights: ") + e.what());
    }
  }
  // The fused path's merged GEMMs read packed weights as views; unpacked, every call would concatenate them
  // (gigabytes per chunk at full size).
  net->pack_merged_weights();
  net->eval();
  return net;
}

trainer::NormStats read_norm_stats_flag(const std::string& flag, const std::string& path) {
  try {
    return trainer::read_norm_stats_file(path);
  } catch (const formats::FormatError& e) {
    throw BadInput(flag + ": " + e.what());
  }
}

}  // namespace vlatune::cli
