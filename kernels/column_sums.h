// Column sums of fp32 partials (column_sums.cu): a norm backward's per-block partials -> its parameter (or adaRMS
// modulation) gradients in one launch, where an ATen sum plus a cast per gradient took two to four; also the
// second pass of bias_grad. Torch-free.
#pragma once

#include <cstdint>

#include "kernels/act_dtype.h"

namespace vlatune::kernels {

// out[c] = sum over r < rows of partials[r * cols + c], summed in fp32 in a fixed order (deterministic) and
// rounded once to `dtype`.
struct ColumnSumParams {
  ActDtype dtype = ActDtype::kBf16;
  int64_t rows = 0, cols = 0;
  const float* partials = nullptr;  // [rows, cols]
  void* out = nullptr;              // [cols]
};
void launch_column_sums(const ColumnSumParams& p, CUstream_st* stream);

}  // namespace vlatune::kernels
