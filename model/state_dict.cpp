// State-dict load/save over safetensors_io. Contract: model/state_dict.h.
#include "model/state_dict.h"

#include <torch/nn/module.h>
#include <torch/utils.h>  // torch::NoGradGuard

#include <algorithm>
#include <sstream>
#include <unordered_map>
#include <utility>

#include "model/pi05.h"

namespace vlatune::model {

namespace {

// LeRobot's pi05 policy wraps the openpi module tree in a `model` attribute (LR modeling_pi05.py).
constexpr const char* kLeRobotPrefix = "model.";
constexpr size_t kSummaryListMax = 20;

std::string shape_str(at::IntArrayRef shape) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << ']';
  return os.str();
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

// Parameters first, then buffers, each in the module's registration order; undefined tensors are skipped.
std::vector<std::pair<std::string, at::Tensor>> named_tensors(const torch::nn::Module& module) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    if (item.value().defined()) out.emplace_back(item.key(), item.value());
  }
  for (const auto& item : module.named_buffers(/*recurse=*/true)) {
    if (item.value().defined()) out.emplace_back(item.key(), item.value());
  }
  return out;
}

void append_list(std::ostringstream& os, const char* what, const std::vector<std::string>& names) {
  if (names.empty()) return;
  os << "; " << names.size() << ' ' << what << ": ";
  for (size_t i = 0; i < names.size() && i < kSummaryListMax; ++i) os << (i ? ", " : "") << names[i];
  if (names.size() > kSummaryListMax) os << " ... (" << names.size() - kSummaryListMax << " more)";
}

// "tiny" or "full" when `cfg` is one of the named configs, else "".
std::string config_name(const Pi05Config& cfg) {
  auto same_gemma = [](const GemmaConfig& a, const GemmaConfig& b) {
    return a.width == b.width && a.depth == b.depth && a.mlp == b.mlp && a.heads == b.heads &&
           a.kv_heads == b.kv_heads && a.head_dim == b.head_dim && a.vocab == b.vocab;
  };
  for (const char* name : {"tiny", "full"}) {
    const Pi05Config n = Pi05Config::named(name);
    const VisionConfig &v = cfg.vision, &w = n.vision;
    if (v.width == w.width && v.depth == w.depth && v.mlp == w.mlp && v.heads == w.heads && v.patch == w.patch &&
        v.image == w.image && same_gemma(cfg.backbone, n.backbone) && same_gemma(cfg.expert, n.expert) &&
        cfg.action_dim == n.action_dim)
      return name;
  }
  return "";
}

}  // namespace

std::string weights_config_name(const torch::nn::Module& module) {
  const auto* pi05 = dynamic_cast<const Pi05Impl*>(&module);
  return pi05 == nullptr ? std::string() : config_name(pi05->config());
}

std::string LoadReport::summary() const {
  std::ostringstream os;
  const size_t total = matched.size() + missing.size() + shape_mismatched.size();
  if (loaded.empty() && !matched.empty()) {
    os << file << ": " << matched.size() << " of " << total << " tensors match by name and shape, nothing loaded";
  } else {
    os << file << ": loaded " << loaded.size() << " of " << total << " tensors";
  }
  if (!stripped_prefix.empty()) os << " (file keys carry the prefix '" << stripped_prefix << "', stripped)";
  if (matched.empty() && !shape_mismatched.empty())
    os << " (no tensor has the model's shape: weights of another model config?)";
  append_list(os, "missing", missing);
  append_list(os, "unexpected", unexpected);
  append_list(os, "shape mismatched", shape_mismatched);
  return os.str();
}

StateDictError::StateDictError(LoadReport report)
    : SafetensorsError(report.file, report.summary().substr(report.file.size() + 2)), report_(std::move(report)) {}

LoadReport load_state_dict(torch::nn::Module& module, const std::string& path, bool strict) {
  const SafetensorsFile file = SafetensorsFile::open(path);
  const std::string expected_config = weights_config_name(module);
  const auto config = file.metadata().find(kConfigMetadataKey);
  if (!expected_config.empty() && config != file.metadata().end() && config->second != expected_config)
    throw SafetensorsError(path, "weights of the '" + config->second + "' config (its metadata " + kConfigMetadataKey +
                                     "), but the model is the '" + expected_config + "' config: choose --config " +
                                     config->second + " or weights of " + expected_config);
  LoadReport report;
  report.file = path;

  std::unordered_map<std::string, at::Tensor> targets;
  for (auto& [name, t] : named_tensors(module)) targets.emplace(name, t);

  // Strip `model.` only when that explains more of the file than keeping it: a module whose own top level is
  // called `model` keeps its names, and a file with a few stray prefixed keys is not rewritten.
  const std::string prefix = kLeRobotPrefix;
  size_t match_plain = 0, match_stripped = 0;
  for (const auto& e : file.entries()) {
    match_plain += targets.count(e.name);
    if (starts_with(e.name, prefix)) match_stripped += targets.count(e.name.substr(prefix.size()));
  }
  const bool strip = match_stripped > match_plain;
  if (strip) report.stripped_prefix = prefix;

  std::vector<std::pair<std::string, const SafetensorsEntry*>> matched;  // module name -> file entry
  std::unordered_map<std::string, const SafetensorsEntry*> claimed;
  for (const auto& e : file.entries()) {
    std::string name = strip && starts_with(e.name, prefix) ? e.name.substr(prefix.size()) : e.name;
    auto it = targets.find(name);
    // A key that maps onto a name another key already took ("model.a" and "a" both present) is unexpected.
    if (it == targets.end() || !claimed.emplace(name, &e).second) {
      report.unexpected.push_back(e.name);
      continue;
    }
    if (it->second.sizes() != at::IntArrayRef(e.shape)) {
      report.shape_mismatched.push_back(name + ": expected " + shape_str(it->second.sizes()) + ", got " +
                                        shape_str(e.shape));
      continue;
    }
    matched.emplace_back(name, &e);
    report.matched.push_back(name);
  }
  for (const auto& [name, t] : targets) {
    if (claimed.count(name) == 0) report.missing.push_back(name);
  }
  std::sort(report.matched.begin(), report.matched.end());
  if (strict && !report.ok()) {
    std::sort(report.missing.begin(), report.missing.end());
    std::sort(report.unexpected.begin(), report.unexpected.end());
    std::sort(report.shape_mismatched.begin(), report.shape_mismatched.end());
    throw StateDictError(std::move(report));  // nothing copied yet: the module is untouched
  }

  torch::NoGradGuard no_grad;
  for (const auto& [name, entry] : matched) {
    // One tensor at a time: host memory holds at most one checkpoint tensor beyond the module itself.
    targets.at(name).copy_(file.tensor(entry->name));  // converts dtype, keeps the parameter's device
    report.loaded.push_back(name);
  }
  std::sort(report.missing.begin(), report.missing.end());
  std::sort(report.unexpected.begin(), report.unexpected.end());
  std::sort(report.shape_mismatched.begin(), report.shape_mismatched.end());
  std::sort(report.loaded.begin(), report.loaded.end());
  return report;
}

void save_state_dict(const torch::nn::Module& module, const std::string& path,
                     const std::map<std::string, std::string>& metadata) {
  std::map<std::string, std::string> meta = metadata;
  const std::string config = weights_config_name(module);
  if (!config.empty()) meta.emplace(kConfigMetadataKey, config);  // keeps a value the caller set
  write_safetensors(path, named_tensors(module), meta);
}

}  // namespace vlatune::model
