// Column sums of fp32 partials (column_sums.h). Torch-free: raw pointers, a stream, VLATUNE_CUDA_CHECK.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>

#include "kernels/column_sums.h"
#include "kernels/cuda_check.h"
#include "kernels/fused_device.cuh"

namespace vlatune::kernels {

using namespace fused_detail;

namespace {

// Tile choices: a block covers kSumCols columns with kSumGroups row groups (thread (x, y) sums
// rows y, y + groups, ... of column x; the groups' sums are then added in group order), so a few hundred rows
// (the norms' backward blocks) are read by 16 threads per column. Few rows (adaRMS: 4 token splits): one group of
// 512 columns per block. In the H200 step the 240 calls take 1.08 ms (bench/RESULTS.md, seventh session).
constexpr int kSumThreads = 512;
constexpr int kSumGroups = 16;
constexpr int kSumCols = kSumThreads / kSumGroups;

// The block: kSumGroups row groups of kSumCols columns when there are rows enough for every group, else one group.
dim3 column_sums_block(int64_t rows) {
  const bool grouped = rows >= 2 * kSumGroups;
  return dim3(grouped ? kSumCols : kSumThreads, grouped ? kSumGroups : 1);
}

template <typename T>
__global__ void __launch_bounds__(kSumThreads) column_sums_kernel(const ColumnSumParams p) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  float sum = 0.f;
  if (c < p.cols)
    for (int64_t r = threadIdx.y; r < p.rows; r += blockDim.y) sum += p.partials[r * p.cols + c];
  if (blockDim.y == 1) {
    if (c < p.cols) static_cast<T*>(p.out)[c] = from_float<T>(sum);
    return;
  }
  __shared__ float group_sums[kSumGroups][kSumCols];
  group_sums[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y != 0 || c >= p.cols) return;
  float total = 0.f;
  for (int g = 0; g < kSumGroups; ++g) total += group_sums[g][threadIdx.x];
  static_cast<T*>(p.out)[c] = from_float<T>(total);
}

}  // namespace

void launch_column_sums(const ColumnSumParams& p, CUstream_st* stream) {
  if (p.rows <= 0 || p.cols <= 0) throw std::invalid_argument("launch_column_sums: rows and cols must be positive");
  const dim3 block = column_sums_block(p.rows);
  const auto blocks = static_cast<unsigned>((p.cols + block.x - 1) / block.x);
  NvtxRange range("vlatune::column_sums");
  if (p.dtype == ActDtype::kBf16) {
    column_sums_kernel<__nv_bfloat16><<<blocks, block, 0, stream>>>(p);
  } else {
    column_sums_kernel<float><<<blocks, block, 0, stream>>>(p);
  }
  VLATUNE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace vlatune::kernels
