#include "tuner/gpus.h"

#include <algorithm>
#include <cctype>
#include <cstdio>

#include "tuner/cost_model.h"

namespace vlatune::tuner {

namespace {

// Lowercase, without spaces, '-' and '_', and without a leading "nvidia".
std::string normalized(const std::string& name) {
  std::string out;
  for (char ch : name)
    if (ch != ' ' && ch != '-' && ch != '_') out += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (out.rfind("nvidia", 0) == 0) out.erase(0, 6);
  return out;
}

// The lowercase alphanumeric words of a name: "NVIDIA GeForce RTX 4090" -> nvidia, geforce, rtx, 4090.
std::vector<std::string> tokens(const std::string& name) {
  std::vector<std::string> out(1);
  for (char ch : name) {
    if (std::isalnum(static_cast<unsigned char>(ch)))
      out.back() += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    else if (!out.back().empty())
      out.emplace_back();
  }
  if (out.back().empty()) out.pop_back();
  return out;
}

std::string known_names() {
  std::string out;
  for (const GpuSpec& g : known_gpus()) out += (out.empty() ? "" : ", ") + g.name;
  return out;
}

}  // namespace

bool has_fp8(const formats::ComputeCapability& capability) {
  return capability.at_least(kFp8Capability.major, kFp8Capability.minor);
}

const std::vector<GpuSpec>& known_gpus() {
  // Memory: the vendors' data sheets, in GB of 1e9 bytes (what the card exposes to CUDA is close to that or a little
  // more; --memory-budget states an exact budget).
  static const std::vector<GpuSpec> gpus = {
      {"RTX 3090", 24e9, {8, 6}},  {"RTX 4090", 24e9, {8, 9}}, {"L4", 24e9, {8, 9}},        {"A10", 24e9, {8, 6}},
      {"RTX A6000", 48e9, {8, 6}}, {"L40S", 48e9, {8, 9}},     {"A100-40GB", 40e9, {8, 0}}, {"A100-80GB", 80e9, {8, 0}},
      {"H100", 80e9, {9, 0}},      {"H200", 141e9, {9, 0}},
  };
  return gpus;
}

const GpuSpec& find_gpu(const std::string& name) {
  const std::string key = normalized(name);
  for (const GpuSpec& g : known_gpus())
    if (normalized(g.name) == key) return g;
  throw PlanInputError("--gpu: unknown GPU '" + name + "'; known: " + known_names() +
                       " (or give --memory-budget in GiB)");
}

std::optional<formats::ComputeCapability> capability_from_device_name(const std::string& device_name) {
  const std::vector<std::string> device = tokens(device_name);
  std::optional<formats::ComputeCapability> found;
  for (const GpuSpec& g : known_gpus()) {
    // The family's words ("A100-80GB" -> a100) all among the device's ("NVIDIA A100-SXM4-80GB").
    bool all = true;
    for (const std::string& word : tokens(g.name)) {
      const bool size = word.size() > 2 && word.compare(word.size() - 2, 2, "gb") == 0;
      all = all && (size || std::find(device.begin(), device.end(), word) != device.end());
    }
    if (!all) continue;
    if (found && !(*found == g.capability)) return std::nullopt;
    found = g.capability;
  }
  return found;
}

std::string format_gpu_table() {
  std::string out = "GPU          memory          compute capability  FP8\n";
  for (const GpuSpec& g : known_gpus()) {
    char line[128];
    std::snprintf(line, sizeof line, "%-12s %4.0f GB %5.1f GiB  %-18s  %s\n", g.name.c_str(), g.memory_bytes / 1e9,
                  g.memory_bytes / kGiB, g.capability.to_string().c_str(), has_fp8(g.capability) ? "yes" : "no");
    out += line;
  }
  return out;
}

}  // namespace vlatune::tuner
