#include "kernels/cuda_check.h"
#include "kernels/device_probe.h"

namespace vlatune::kernels {

namespace {
__global__ void device_code_arch_kernel(int* out) {
#ifdef __CUDA_ARCH__
  *out = __CUDA_ARCH__;
#endif
}
}  // namespace

int query_compute_capability(int device) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || device < 0 || device >= count) {
    (void)cudaGetLastError();
    return -1;
  }
  int major = 0, minor = 0;
  VLATUNE_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  VLATUNE_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return major * 10 + minor;
}

int launch_device_code_arch() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    (void)cudaGetLastError();  // clear the sticky "no device" error
    return -1;
  }
  int* d_out = nullptr;
  int h_out = -1;
  VLATUNE_CUDA_CHECK(cudaMalloc(&d_out, sizeof(int)));
  VLATUNE_CUDA_CHECK(cudaMemset(d_out, 0xff, sizeof(int)));
  device_code_arch_kernel<<<1, 1>>>(d_out);
  VLATUNE_CUDA_CHECK(cudaGetLastError());
  VLATUNE_CUDA_CHECK(cudaMemcpy(&h_out, d_out, sizeof(int), cudaMemcpyDeviceToHost));
  VLATUNE_CUDA_CHECK(cudaFree(d_out));
  return h_out;
}

}  // namespace vlatune::kernels
