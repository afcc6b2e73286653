#include "cli/torch_options.h"

#include "cli/cli.h"

namespace vlatune::cli {

torch::Device parse_device(const std::string& flag, const std::string& value) {
  if (value == "auto") return torch::cuda::is_available() ? torch::Device(torch::kCUDA) : torch::Device(torch::kCPU);
  if (value == "cpu") return torch::kCPU;
  if (value == "cuda") {
    if (!torch::cuda::is_available()) throw BadInput(flag + " cuda: no CUDA device is visible");
    return torch::kCUDA;
  }
  throw BadInput(flag + ": unknown device '" + value + "' (auto, cpu, cuda)");
}

torch::Dtype parse_dtype(const std::string& flag, const std::string& value) {
  if (value == "fp32") return torch::kFloat32;
  if (value == "bf16") return torch::kBFloat16;
  if (value == "fp64") return torch::kFloat64;
  throw BadInput(flag + ": unknown dtype '" + value + "' (fp32, bf16, fp64)");
}

}  // namespace vlatune::cli
