// Which machine code the device actually runs: a kernel built for sm_90 reports __CUDA_ARCH__ = 900.
// A build without Hopper SASS would still run through PTX JIT (and silently miss wgmma/TMA); the GPU
// test and `vlatune --version` use this to catch that.
#pragma once

namespace vlatune::kernels {

// True when this build contains CUDA kernels.
bool cuda_kernels_built();

// __CUDA_ARCH__ of the code the current device executes (e.g. 900), or -1 when no CUDA device is usable.
int device_code_arch();

}  // namespace vlatune::kernels
