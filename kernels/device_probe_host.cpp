#include "kernels/device_probe.h"

namespace vlatune::kernels {

#ifdef VLATUNE_HAVE_CUDA
int launch_device_code_arch();  // device_probe.cu
bool cuda_kernels_built() {
  return true;
}
int device_code_arch() {
  return launch_device_code_arch();
}
#else
bool cuda_kernels_built() {
  return false;
}
int device_code_arch() {
  return -1;
}
#endif

}  // namespace vlatune::kernels
