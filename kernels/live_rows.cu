// Live rows spread back over all rows (live_rows.h). Torch-free: raw pointers, a stream, VLATUNE_CUDA_CHECK.
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>

#include "kernels/cuda_check.h"
#include "kernels/fused_device.cuh"
#include "kernels/live_rows.h"

namespace vlatune::kernels {

using namespace fused_detail;

namespace {

// One block per output row, one 16-byte word per thread and pass: the backbone's rows are 256-320 words (widths
// 2,048-2,560 in bf16). Every output byte is written once (no zero fill first, no index_copy_ pass: ATen's
// index_copy_ moved these rows at a fraction of the DRAM rate in the H200 step).
constexpr int kSpreadThreads = 256;

__global__ void __launch_bounds__(kSpreadThreads) spread_rows_kernel(const SpreadRowsParams p) {
  const int64_t row = blockIdx.x;
  const int64_t words = p.row_bytes / 16;
  const int64_t slot = p.slots[row];
  uint4* out = reinterpret_cast<uint4*>(static_cast<char*>(p.out) + row * p.row_bytes);
  if (slot >= 0 && slot < p.live) {
    const uint4* src = reinterpret_cast<const uint4*>(static_cast<const char*>(p.src) + slot * p.row_bytes);
    for (int64_t w = threadIdx.x; w < words; w += blockDim.x) out[w] = src[w];
  } else {
    for (int64_t w = threadIdx.x; w < words; w += blockDim.x) out[w] = make_uint4(0, 0, 0, 0);
  }
}

}  // namespace

void launch_spread_rows(const SpreadRowsParams& p, CUstream_st* stream) {
  if (p.rows <= 0 || p.rows > 0x7fffffff || p.live < 0 || p.row_bytes <= 0 || p.row_bytes % 16 != 0)
    throw std::invalid_argument(
        "launch_spread_rows: rows must be in [1, 2^31), live >= 0 and row_bytes a positive "
        "multiple of 16");
  const int64_t words = p.row_bytes / 16;
  const int threads = words >= kSpreadThreads ? kSpreadThreads : static_cast<int>((words + 31) / 32 * 32);
  NvtxRange range("vlatune::spread_rows");
  spread_rows_kernel<<<static_cast<unsigned>(p.rows), threads, 0, stream>>>(p);
  VLATUNE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace vlatune::kernels
