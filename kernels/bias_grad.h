// A Linear's bias gradient as two kernels (bias_grad.cu): torch-free params and the raw-pointer launcher. The
// dispatch (kernel on CUDA, ATen's sum elsewhere): bias_grad_autograd.cpp (entry point in fused_ops.h).
#pragma once

#include <cstdint>

#include "kernels/act_dtype.h"

namespace vlatune::kernels {

// out[c] = sum over the rows of g [rows, cols] (dense, 16-byte aligned, cols a multiple of the 16-byte vector),
// fp32 accumulation, one rounding to the dtype. Two launches: fp32 partial sums per chunk of rows
// ([bias_grad_chunks(rows, cols), cols] in `partials`), then launch_column_sums of them. Every warp reads 16-byte
// vectors along whole rows: in the H200 step it takes 2.5 ms for 113 calls, and the step measured with ATen's column
// sums instead was no faster (bench/RESULTS.md, seventh session).
struct BiasGradParams {
  ActDtype dtype = ActDtype::kBf16;
  int64_t rows = 0, cols = 0;
  const void* g = nullptr;    // [rows, cols]
  float* partials = nullptr;  // [bias_grad_chunks(rows, cols), cols]
  void* out = nullptr;        // [cols]
};
bool bias_grad_supported(ActDtype dtype, int64_t cols);
int64_t bias_grad_chunks(int64_t rows, int64_t cols);
void launch_bias_grad(const BiasGradParams& p, CUstream_st* stream);

}  // namespace vlatune::kernels
