// VLATUNE_CUDA_CHECK: a failed CUDA runtime call throws with the statement, the error string and file:line.
// Torch-free: included by .cu files.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#define VLATUNE_CUDA_CHECK(expr)                                                                                  \
  do {                                                                                                            \
    cudaError_t vlatune_err_ = (expr);                                                                            \
    if (vlatune_err_ != cudaSuccess) {                                                                            \
      throw std::runtime_error(std::string("CUDA error: ") + cudaGetErrorString(vlatune_err_) + " in `" + #expr + \
                               "` at " + __FILE__ + ":" + std::to_string(__LINE__));                              \
    }                                                                                                             \
  } while (0)
