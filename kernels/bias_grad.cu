// A Linear's bias gradient (bias_grad.h): fp32 partial sums per chunk of rows, then column_sums.cu.
// Torch-free: raw pointers, a stream, VLATUNE_CUDA_CHECK.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>

#include "kernels/bias_grad.h"
#include "kernels/column_sums.h"
#include "kernels/cuda_check.h"
#include "kernels/fused_device.cuh"

namespace vlatune::kernels {

using namespace fused_detail;

namespace {

// Tile choices of the first pass: a block takes kBiasVecs 16-byte column vectors of one chunk of rows; its kBiasLanes
// row lanes stride through the chunk with kBiasUnroll loads in flight each, and the lanes' sums are added in lane
// order through shared memory ([lane][element][vector]: conflict-free), one partial per column and chunk. The grid is
// sized to ~kBiasBlocksPerSm blocks per SM (columns x chunks) with at least kBiasMinRows rows per chunk (bias_grid).
// Every warp reads whole 16-byte row vectors: in the H200 step the 113 calls take 2.5 ms, where ATen's bf16 column
// reductions took 5.07 ms for 167 (bench/RESULTS.md, sixth and seventh sessions).
constexpr int kBiasVecs = 32;
constexpr int kBiasLanes = 8;
constexpr int kBiasUnroll = 4;
constexpr int kBiasBlocksPerSm = 4;
constexpr int64_t kBiasMinRows = kBiasLanes * kBiasUnroll;
constexpr int kMaxVec = 8;  // kVec<bf16>

struct BiasGrid {
  int64_t col_blocks, chunks, rows_per_chunk;
};

BiasGrid bias_grid(int64_t rows, int64_t cols, int vec) {
  BiasGrid g;
  g.col_blocks = (cols / vec + kBiasVecs - 1) / kBiasVecs;
  const int64_t target = static_cast<int64_t>(fused_detail::sm_count()) * kBiasBlocksPerSm;
  const int64_t wanted = std::max<int64_t>(1, (target + g.col_blocks - 1) / g.col_blocks);
  const int64_t most = std::max<int64_t>(1, rows / kBiasMinRows);
  g.rows_per_chunk = (rows + std::min(wanted, most) - 1) / std::min(wanted, most);
  g.chunks = (rows + g.rows_per_chunk - 1) / g.rows_per_chunk;
  return g;
}

template <typename T>
__global__ void __launch_bounds__(kBiasVecs* kBiasLanes)
    bias_grad_partials_kernel(const BiasGradParams p, const int64_t rows_per_chunk) {
  constexpr int V = kVec<T>;
  const int64_t nvec = p.cols / V;
  const int64_t vc = static_cast<int64_t>(blockIdx.x) * kBiasVecs + threadIdx.x;
  const int64_t r_begin = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t r_end = std::min<int64_t>(p.rows, r_begin + rows_per_chunk);
  float acc[V];
#pragma unroll
  for (int k = 0; k < V; ++k) acc[k] = 0.f;
  if (vc < nvec) {
    const T* g = static_cast<const T*>(p.g);
    int64_t r = r_begin + threadIdx.y;
    for (; r + (kBiasUnroll - 1) * kBiasLanes < r_end; r += kBiasUnroll * kBiasLanes) {
      Pack<T, V> v[kBiasUnroll];
#pragma unroll
      for (int u = 0; u < kBiasUnroll; ++u) v[u] = load_pack(g + (r + u * kBiasLanes) * p.cols, vc);
#pragma unroll
      for (int u = 0; u < kBiasUnroll; ++u)
#pragma unroll
        for (int k = 0; k < V; ++k) acc[k] += to_float(v[u].v[k]);
    }
    for (; r < r_end; r += kBiasLanes) {
      const Pack<T, V> v = load_pack(g + r * p.cols, vc);
#pragma unroll
      for (int k = 0; k < V; ++k) acc[k] += to_float(v.v[k]);
    }
  }
  __shared__ float lane_sums[kBiasLanes][kMaxVec][kBiasVecs];
#pragma unroll
  for (int k = 0; k < V; ++k) lane_sums[threadIdx.y][k][threadIdx.x] = acc[k];
  __syncthreads();
  // Thread t finishes column t of the block's kBiasVecs * V columns (vector t / V, element t % V).
  const int t = threadIdx.y * kBiasVecs + threadIdx.x;
  if (t >= kBiasVecs * V) return;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kBiasVecs * V + t;
  if (c >= p.cols) return;
  float sum = 0.f;
  for (int lane = 0; lane < kBiasLanes; ++lane) sum += lane_sums[lane][t % V][t / V];
  p.partials[static_cast<int64_t>(blockIdx.y) * p.cols + c] = sum;
}

}  // namespace

bool bias_grad_supported(ActDtype dtype, int64_t cols) {
  const int vec = dtype == ActDtype::kBf16 ? kVec<__nv_bfloat16> : kVec<float>;
  return cols > 0 && cols % vec == 0;
}

int64_t bias_grad_chunks(int64_t rows, int64_t cols) {
  // The row chunks come from the bf16 grid for either dtype (fp32 only doubles the column blocks).
  return rows > 0 && cols > 0 ? bias_grid(rows, cols, kVec<__nv_bfloat16>).chunks : 0;
}

void launch_bias_grad(const BiasGradParams& p, CUstream_st* stream) {
  if (p.rows <= 0 || !bias_grad_supported(p.dtype, p.cols))
    throw std::invalid_argument("launch_bias_grad: rows must be positive and cols a multiple of the 16-byte vector");
  const BiasGrid grid = bias_grid(p.rows, p.cols, kVec<__nv_bfloat16>);
  NvtxRange range("vlatune::bias_grad");
  const dim3 block(kBiasVecs, kBiasLanes);
  if (p.dtype == ActDtype::kBf16) {
    const dim3 blocks(static_cast<unsigned>(grid.col_blocks), static_cast<unsigned>(grid.chunks));
    bias_grad_partials_kernel<__nv_bfloat16><<<blocks, block, 0, stream>>>(p, grid.rows_per_chunk);
  } else {
    // fp32: 4 columns per vector, so twice the column blocks of the bf16 grid; the same chunks.
    const int64_t col_blocks = (p.cols / kVec<float> + kBiasVecs - 1) / kBiasVecs;
    const dim3 blocks(static_cast<unsigned>(col_blocks), static_cast<unsigned>(grid.chunks));
    bias_grad_partials_kernel<float><<<blocks, block, 0, stream>>>(p, grid.rows_per_chunk);
  }
  VLATUNE_CUDA_CHECK(cudaGetLastError());
  ColumnSumParams sums;
  sums.dtype = p.dtype;
  sums.rows = grid.chunks;
  sums.cols = p.cols;
  sums.partials = p.partials;
  sums.out = p.out;
  launch_column_sums(sums, stream);
}

}  // namespace vlatune::kernels
