#include "kernels/device_probe.h"

namespace vlatune::kernels {

std::string compute_capability_name(int compute_capability) {
  if (compute_capability < 0) return "none";
  return std::to_string(compute_capability / 10) + "." + std::to_string(compute_capability % 10);
}

const char* cuda_archs_built() {
#ifdef VLATUNE_CUDA_ARCHS_BUILT
  return VLATUNE_CUDA_ARCHS_BUILT;
#else
  return "";
#endif
}

#ifdef VLATUNE_HAVE_CUDA
int launch_device_code_arch();             // device_probe.cu
int query_compute_capability(int device);  // device_probe.cu
bool cuda_kernels_built() {
  return true;
}
int device_code_arch() {
  return launch_device_code_arch();
}
int device_compute_capability(int device) {
  return query_compute_capability(device);
}
#else
bool cuda_kernels_built() {
  return false;
}
int device_code_arch() {
  return -1;
}
int device_compute_capability(int) {
  return -1;
}
#endif

}  // namespace vlatune::kernels
