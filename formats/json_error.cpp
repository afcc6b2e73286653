#include "formats/json_error.h"

namespace vlatune::formats {

namespace {
std::string compose(const std::string& file, const std::string& json_path, const std::string& reason) {
  std::string msg = file.empty() ? std::string("<input>") : file;
  if (!json_path.empty()) msg += ": " + json_path;
  return msg + ": " + reason;
}
}  // namespace

FormatError::FormatError(std::string file, std::string json_path, std::string reason)
    : std::runtime_error(compose(file, json_path, reason)),
      file_(std::move(file)),
      json_path_(std::move(json_path)),
      reason_(std::move(reason)) {}

}  // namespace vlatune::formats
