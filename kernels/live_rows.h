// A block of live rows spread back over all rows, zeros elsewhere (live_rows.cu): torch-free params and a
// raw-pointer launcher. Checks, the ATen reference and the autograd pair (gather_rows / spread_rows): live_rows_
// autograd.cpp (entry points in fused_ops.h). The backbone's prefix stream keeps only its live rows
// (model::live_prefix_rows); the attention reads the prefix at every position, so its Q/K/V rows are spread out
// there and the attention output's live rows gathered back.
#pragma once

#include <cstdint>

#include "kernels/act_dtype.h"

namespace vlatune::kernels {

// out[i] = src[slots[i]] where slots[i] < live, else zero bytes, for every row i < rows. A copy: any dtype, rows of
// row_bytes (a multiple of 16), src and out 16-byte aligned.
struct SpreadRowsParams {
  int64_t rows = 0, live = 0, row_bytes = 0;
  const int64_t* slots = nullptr;  // [rows]: a row's place among the live rows; >= live for a row left out
  const void* src = nullptr;       // [live, row_bytes]
  void* out = nullptr;             // [rows, row_bytes]
};
void launch_spread_rows(const SpreadRowsParams& p, CUstream_st* stream);

}  // namespace vlatune::kernels
