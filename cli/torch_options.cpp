#include "cli/torch_options.h"

#include "cli/cli.h"
#include "trainer/environment.h"

namespace vlatune::cli {

torch::Device parse_device(const std::string& flag, const std::string& value) {
  try {
    return trainer::resolve_device(flag, value);
  } catch (const std::invalid_argument& e) {
    throw BadInput(e.what());
  }
}

torch::Dtype parse_dtype(const std::string& flag, const std::string& value) {
  if (value == "fp32") return torch::kFloat32;
  if (value == "bf16") return torch::kBFloat16;
  if (value == "fp64") return torch::kFloat64;
  throw BadInput(flag + ": unknown dtype '" + value + "' (fp32, bf16, fp64)");
}

}  // namespace vlatune::cli
