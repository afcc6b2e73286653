// What the GPU is and runs, asked at run time. device_code_arch: which machine code the device actually runs (a
// kernel built for sm_90 reports __CUDA_ARCH__ = 900; a GPU newer than every SASS of the build runs the compute_90
// PTX through the driver's JIT and reports 900 too); the GPU test and `vlatune --version` use it to catch a build
// without the GPU's SASS. device_compute_capability and the feature checks below: what the hardware offers, so that
// a missing feature falls back to a working path instead of failing inside a library.
#pragma once

#include <string>

namespace vlatune::kernels {

// FP8 GEMMs (cuBLASLt e4m3/e5m2, torch's _scaled_mm) need compute capability 8.9 (Ada, Hopper and newer).
inline constexpr int kFp8MinComputeCapability = 89;

// Compute capability `major * 10 + minor` (80 A100, 86 RTX 30 / A10, 89 L40S / RTX 4090, 90 H100 / H200, 100+
// Blackwell), as the profile and recipes record it.
inline bool fp8_supported(int compute_capability) {
  return compute_capability >= kFp8MinComputeCapability;
}

// "8.9" for 89.
std::string compute_capability_name(int compute_capability);

// True when this build contains CUDA kernels.
bool cuda_kernels_built();

// The architectures the .cu files were built for, as CMake's VLATUNE_CUDA_ARCHS names them ("8.0;8.6;8.9;9.0+PTX";
// "" without CUDA kernels).
const char* cuda_archs_built();

// __CUDA_ARCH__ of the code the current device executes (e.g. 900), or -1 when no CUDA device is usable.
int device_code_arch();

// Compute capability of CUDA device `device` (major * 10 + minor), or -1 when there is no such device or the build
// has no CUDA.
int device_compute_capability(int device);

}  // namespace vlatune::kernels
