#include "trainer/environment.h"

#include <cctype>
#include <fstream>
#include <sstream>
#include <stdexcept>

#ifdef VLATUNE_HAVE_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime.h>
#endif

namespace vlatune::trainer {

namespace {
// The kernel module's version ("580.159.04") from /proc/driver/nvidia/version; empty when unreadable.
std::string nvidia_driver_version() {
  std::ifstream f("/proc/driver/nvidia/version");
  std::string line;
  if (!std::getline(f, line)) return {};
  std::istringstream words(line);
  std::string word;
  while (words >> word)
    if (!word.empty() && std::isdigit(static_cast<unsigned char>(word[0])) && word.find('.') != std::string::npos)
      return word;
  return {};
}
}  // namespace

void use_aten_cpu_kernels() {
  at::globalContext().setUserEnabledMkldnn(false);
}

torch::Device resolve_device(const std::string& flag, const std::string& choice) {
  if (choice == "cpu") return torch::kCPU;
  if (choice == "cuda" || choice == "auto") {
    if (torch::cuda::is_available()) return torch::Device(torch::kCUDA, 0);
    if (choice == "cuda") throw std::invalid_argument(flag + " cuda: no CUDA device is visible");
    return torch::kCPU;
  }
  throw std::invalid_argument(flag + ": unknown device '" + choice + "' (auto, cpu, cuda)");
}

formats::Environment capture_environment(torch::Device device, const std::string& config,
                                         const std::string& recipe_hash, int world_size) {
  formats::Environment env;
  env.torch = VLATUNE_TORCH_VERSION;
  env.vlatune_commit = std::string(vlatune_commit());
  env.config = config;
  env.recipe_hash = recipe_hash;
  env.world_size = world_size;
#ifdef VLATUNE_HAVE_CUDA
  if (device.is_cuda()) {
    const cudaDeviceProp* prop = at::cuda::getDeviceProperties(device.has_index() ? device.index() : 0);
    env.gpu = std::string(prop->name);
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    const std::string module_version = nvidia_driver_version();
    env.driver = !module_version.empty()
                     ? module_version
                     : "cuda-driver-api " + std::to_string(driver / 1000) + "." + std::to_string((driver % 1000) / 10);
    env.cuda = std::to_string(runtime / 1000) + "." + std::to_string((runtime % 1000) / 10);
  }
#endif
  return env;
}

namespace {

// The peak of one of the caching allocator's byte statistics on `device`, in GiB (0 on the CPU).
template <typename Select>
double allocator_peak_gib(torch::Device device, Select select) {
#ifdef VLATUNE_HAVE_CUDA
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.has_index() ? device.index() : 0);
    const auto& peak = select(stats)[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak;
    return static_cast<double>(peak) / static_cast<double>(1ull << 30);
  }
#endif
  (void)select;
  return 0.0;
}

}  // namespace

double peak_allocated_gib(torch::Device device) {
  return allocator_peak_gib(
      device, [](const auto& stats) -> const auto& { return stats.allocated_bytes; });
}

double peak_reserved_gib(torch::Device device) {
  return allocator_peak_gib(
      device, [](const auto& stats) -> const auto& { return stats.reserved_bytes; });
}

void reset_peak_allocated(torch::Device device) {
#ifdef VLATUNE_HAVE_CUDA
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device.has_index() ? device.index() : 0);
#endif
}

}  // namespace vlatune::trainer
