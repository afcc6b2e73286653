// The one error type of every format reader: it names the file, the JSON path and what was wrong, e.g.
//   recipe.json: $.fp8.modules[3]: no module '...layers.18.mlp.gate_proj' (0..17)
#pragma once

#include <stdexcept>
#include <string>

namespace vlatune::formats {

class FormatError : public std::runtime_error {
 public:
  FormatError(std::string file, std::string json_path, std::string reason);
  const std::string& file() const { return file_; }
  const std::string& json_path() const { return json_path_; }
  const std::string& reason() const { return reason_; }

 private:
  std::string file_, json_path_, reason_;
};

}  // namespace vlatune::formats
