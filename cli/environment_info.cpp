// `vlatune --version`: what this binary is and what it runs on. The only CLI file that asks torch/CUDA.
#include <torch/torch.h>
#ifdef VLATUNE_HAVE_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

#include <sstream>

#include "cli/cli.h"
#include "kernels/device_probe.h"
#include "profiler/cupti_api.h"
#include "trainer/environment.h"
#include "trainer/nccl_info.h"

namespace vlatune::cli {

std::string version_text() {
  std::ostringstream os;
  os << "vlatune " << VLATUNE_VERSION << " (commit " << trainer::vlatune_commit() << ")\n";
  os << "LibTorch " << VLATUNE_TORCH_VERSION << "\n";
  os << "CUDA support: "
     << (kernels::cuda_kernels_built() ? std::string("built (kernels for ") + kernels::cuda_archs_built() + ")"
                                       : std::string("not built"))
     << "\n";
  os << profiler::cupti_version_text() << "; " << trainer::nccl_version_text() << "\n";
  os << "GPU: ";
  if (torch::cuda::is_available()) {
#ifdef VLATUNE_HAVE_CUDA
    const cudaDeviceProp* prop = at::cuda::getDeviceProperties(0);
    os << prop->name << " (" << static_cast<int>(torch::cuda::device_count()) << " visible, compute " << prop->major
       << "." << prop->minor << ", " << (prop->totalGlobalMem >> 20) << " MiB; vlatune kernels run sm_"
       << kernels::device_code_arch() / 10 << " code; FP8 "
       << (kernels::fp8_supported(kernels::device_compute_capability(0)) ? "yes" : "no, needs compute 8.9") << ")";
#else
    os << torch::cuda::device_count() << " CUDA device(s) visible";
#endif
  } else {
    os << "none";
  }
  os << "\n";
  return os.str();
}

}  // namespace vlatune::cli
