// Load a torch::nn::Module's parameters and buffers from a safetensors file by name, and save them to one.
// Names are the module's own FQNs (for Pi0.5: the openpi PyTorch names, spec §11.2), so openpi checkpoints load
// key for key; LeRobot's extra `model.` prefix is recognised and stripped.
#pragma once

#include "model/safetensors_io.h"

#include <map>
#include <string>
#include <vector>

namespace torch::nn {
class Module;
}

namespace vlatune::model {

// The safetensors metadata key naming the model config of a weights file ("tiny" | "full"). save_state_dict writes
// it for a Pi0.5 of a named config; load_state_dict refuses weights of another config in one line.
inline constexpr const char* kConfigMetadataKey = "vlatune.config";

// What a load found, name by name. Every list is sorted.
struct LoadReport {
  std::string file;
  std::string stripped_prefix;                // "model." when LeRobot's prefix was stripped from the file's keys
  std::vector<std::string> missing;           // module names the file does not hold
  std::vector<std::string> unexpected;        // file keys (as written in the file) the module does not have
  std::vector<std::string> shape_mismatched;  // "name: expected [4, 3], got [4, 5]" (expected = the module's)
  std::vector<std::string> matched;           // module names the file holds with the module's shape
  std::vector<std::string> loaded;            // module names copied from the file (= matched, unless a strict
                                              // load refused)

  bool ok() const { return missing.empty() && unexpected.empty() && shape_mismatched.empty(); }
  // One paragraph: "<file>: loaded 3 of 5 tensors; 1 missing: ...; 1 unexpected: ...; 1 shape mismatched: ...",
  // or, when a strict load refused, "<file>: 3 of 5 tensors match by name and shape, nothing loaded; ...".
  // Lists longer than 20 names end in "... (N more)"; the report itself holds them all.
  std::string summary() const;
};

// A strict load that found problems: what() is the summary, report() has every name.
class StateDictError : public SafetensorsError {
 public:
  explicit StateDictError(LoadReport report);
  const LoadReport& report() const { return report_; }

 private:
  LoadReport report_;
};

// Copies every tensor of `path` whose name matches a parameter or buffer of `module` (recursively, by FQN) into
// it: the value is converted to the parameter's dtype and stays on the parameter's device; autograd does not see
// the copy. The `model.` prefix is stripped from the file's keys when that matches more module names than
// keeping it. strict: if anything is missing, unexpected or shape-mismatched, throws StateDictError before
// copying anything; otherwise loads what matches and returns the report. File defects: SafetensorsError (a header
// defect before anything is copied; a bad BOOL byte only when that tensor's turn comes). Loading into a Pi0.5 of a
// named config a file whose metadata names another config throws SafetensorsError, one line naming both, before
// anything is matched.
LoadReport load_state_dict(torch::nn::Module& module, const std::string& path, bool strict = true);

// The named config ("tiny" | "full") of `module` when it is a Pi0.5 of one, else "": the kConfigMetadataKey value
// its weights files carry.
std::string weights_config_name(const torch::nn::Module& module);

// Writes every defined parameter and buffer of `module` under its FQN (parameters first, each in registration
// order), with their dtypes, through write_safetensors (atomic). For a Pi0.5 of a named config, the metadata gets
// kConfigMetadataKey unless `metadata` sets it.
void save_state_dict(const torch::nn::Module& module, const std::string& path,
                     const std::map<std::string, std::string>& metadata = {});

}  // namespace vlatune::model
