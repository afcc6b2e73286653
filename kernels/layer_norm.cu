// SigLIP's LayerNorm with the residual add fused: forward and backward (math in layer_norm.h, design in fused.md).
// Torch-free: raw pointers, a stream, VLATUNE_CUDA_CHECK.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda_check.h"
#include "kernels/fused_device.cuh"
#include "kernels/layer_norm.h"
#include "kernels/norm_device.cuh"

namespace vlatune::kernels {

using namespace fused_detail;
using namespace norm_detail;

namespace {

// ---- Tile choices ----
// Forward: one warp per row for rows of at most 32 * kWarpMaxIters vectors (SigLIP: 1152 bf16 = 144 vectors, 4.5 per
// lane), kWarpRows rows per block; wider rows a block per row (norm_detail::row_shape). The block-per-row kernel ran
// SigLIP's LayerNorm at 2.5 TB/s of the 4.3 the H200 copies at (61 us per call at batch 32; bench/RESULTS.md, fourth
// session): its two block reductions per 2.3 KB row were latency, not bandwidth. One warp per row: 0.088 ms where the
// block per row took 0.099 (BM_fused_layer_norm_residual, 2026-11-30).
constexpr int kWarpRows = 4;
constexpr int kWarpMaxIters = 8;
// Backward: one warp per row up to kBwdWarpMaxIters vectors per lane (SigLIP's 4.5), as many blocks as are resident;
// wider rows the block kernel's grid-stride loop (norm_detail::bwd_blocks). The block-per-row kernel ran SigLIP's
// shape at 121 us per call in the step (1.25 TB/s), the warp kernel at 87 with the weight/bias sums in registers
// (bench/RESULTS.md, seventh session): 80 accumulators per lane at SigLIP's width capped it at three blocks per SM
// with spills. The sums live in the warp's shared-memory slice instead (each lane updates only its own columns, so
// no barrier): four blocks per SM at 128 registers without spills, 0.080 -> 0.061 ms per call at SigLIP's batch-32
// shape (scripts/dev/layer-norm-ab-gpu.sh; five or six blocks spill and ran 0.083 and 0.116, three 0.064).
constexpr int kBwdWarpMaxIters = 5;
constexpr int kBwdWarpMinBlocks = 4;

// The warp kernels' vectors per lane for this width: forward 2, 4, 5 or kWarpMaxIters; backward 2, 4 or
// kBwdWarpMaxIters; 0 when the block kernel runs it.
int warp_iters(bool backward, ActDtype dtype, int64_t width) {
  if (!width_ok(dtype, width)) return 0;
  const int vec = dtype == ActDtype::kBf16 ? kVec<__nv_bfloat16> : kVec<float>;
  const int64_t lane_iters = (width / vec + 31) / 32;
  if (lane_iters <= 2) return 2;
  if (lane_iters <= 4) return 4;
  if (!backward) return lane_iters == 5 ? 5 : lane_iters <= kWarpMaxIters ? kWarpMaxIters : 0;
  return lane_iters <= kBwdWarpMaxIters ? kBwdWarpMaxIters : 0;
}

// One row of the LayerNorm forward, by `threads` threads of which this is `tid` (vector j = it * threads + tid);
// `sum_all` sums a value over those threads: a block (block_sum_all) or a warp (warp_sum_all).
template <typename T, int ITERS, typename SumAll>
__device__ __forceinline__ void layer_norm_fwd_row(const LayerNormFwdParams& p, int64_t row, int tid, int threads,
                                                   SumAll&& sum_all) {
  constexpr int V = kVec<T>;
  const int nvec = static_cast<int>(p.width / V);
  const int64_t base = row * p.width;
  const float inv_width = 1.f / static_cast<float>(p.width);
  float hv[ITERS][V];
  float sum = 0.f;
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    const int j = it * threads + tid;
    if (j >= nvec) continue;
    Pack<T, V> xp = load_pack(static_cast<const T*>(p.x) + base, j);
    if (p.delta != nullptr) {
      const Pack<T, V> dp = load_pack(static_cast<const T*>(p.delta) + base, j);
#pragma unroll
      for (int k = 0; k < V; ++k) xp.v[k] = from_float<T>(to_float(xp.v[k]) + to_float(dp.v[k]));
      store_pack(static_cast<T*>(p.h) + base, j, xp);
    }
#pragma unroll
    for (int k = 0; k < V; ++k) {
      hv[it][k] = to_float(xp.v[k]);
      sum += hv[it][k];
    }
  }
  const float mean = sum_all(sum) * inv_width;
  // Two passes over the registers: the variance of the centred values (no cancellation).
  float ss = 0.f;
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    const int j = it * threads + tid;
    if (j >= nvec) continue;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float c = hv[it][k] - mean;
      ss += c * c;
    }
  }
  const float rstd = rsqrtf(sum_all(ss) * inv_width + p.eps);
  if (tid == 0) {
    p.mean[row] = mean;
    p.rstd[row] = rstd;
  }
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    const int j = it * threads + tid;
    if (j >= nvec) continue;
    float wv[V], bv[V];
    load_param_vec<T, V>(p.weight, p.weight_t, j, wv);
    load_param_vec<T, V>(p.bias, p.bias_t, j, bv);
    Pack<T, V> out;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      out.v[k] = from_float<T>((hv[it][k] - mean) * rstd * wv[k] + bv[k]);
    }
    store_pack(static_cast<T*>(p.y) + base, j, out);
  }
}

// One block per row (rows up to kMaxThreads * kMaxIters vectors).
template <typename T, int ITERS>
__global__ void __launch_bounds__(kMaxThreads) layer_norm_fwd_kernel(const LayerNormFwdParams p) {
  layer_norm_fwd_row<T, ITERS>(p, blockIdx.x, static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x),
                               [](float x) { return block_sum_all(x); });
}

// One warp per row, kWarpRows rows per block: shuffles instead of block barriers (tiles: above).
__device__ __forceinline__ float warp_sum_all(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

template <typename T, int ITERS>
__global__ void __launch_bounds__(kWarpRows * 32) layer_norm_fwd_warp_kernel(const LayerNormFwdParams p) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpRows + (threadIdx.x >> 5);
  if (row >= p.rows) return;  // whole warps leave: the shuffles see full warps
  layer_norm_fwd_row<T, ITERS>(p, row, static_cast<int>(threadIdx.x & 31), 32, [](float x) { return warp_sum_all(x); });
}

template <typename T, int ITERS>
__global__ void __launch_bounds__(kMaxThreads) layer_norm_bwd_kernel(const LayerNormBwdParams p) {
  constexpr int V = kVec<T>;
  const int nvec = static_cast<int>(p.width / V);
  const float inv_width = 1.f / static_cast<float>(p.width);
  float w[ITERS][V], acc_w[ITERS][V], acc_b[ITERS][V];
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    const int j = it * blockDim.x + threadIdx.x;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      w[it][k] = j < nvec ? param_at<T>(p.weight, p.weight_t, static_cast<int64_t>(j) * V + k) : 0.f;
      acc_w[it][k] = acc_b[it][k] = 0.f;
    }
  }
  // The next row's inputs are loaded before this row's reductions (software pipelining): a block has one row in
  // flight otherwise, and its two barriers per row left the loads waiting (2.0 TB/s at SigLIP's shape).
  Pack<T, V> next_h[ITERS], next_g[ITERS], next_gh[ITERS];
  auto load_row = [&](int64_t row) {
    const int64_t base = row * p.width;
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
      const int j = it * blockDim.x + threadIdx.x;
      if (j >= nvec) continue;
      next_h[it] = load_pack(static_cast<const T*>(p.h) + base, j);
      next_g[it] = load_pack(static_cast<const T*>(p.grad_y) + base, j);
      if (p.grad_h != nullptr) next_gh[it] = load_pack(static_cast<const T*>(p.grad_h) + base, j);
    }
  };
  if (blockIdx.x < p.rows) load_row(blockIdx.x);
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const float mean = p.mean[row], rstd = p.rstd[row];
    const int64_t base = row * p.width;
    Pack<T, V> gh[ITERS];
    float n[ITERS][V], g[ITERS][V];
    float sum_g = 0.f, dot = 0.f;
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
      const int j = it * blockDim.x + threadIdx.x;
      if (j >= nvec) continue;
      const Pack<T, V> hp = next_h[it];
      const Pack<T, V> gp = next_g[it];
      gh[it] = next_gh[it];
#pragma unroll
      for (int k = 0; k < V; ++k) {
        n[it][k] = (to_float(hp.v[k]) - mean) * rstd;
        const float gy = to_float(gp.v[k]);
        g[it][k] = gy * w[it][k];
        acc_w[it][k] += gy * n[it][k];
        acc_b[it][k] += gy;
        sum_g += g[it][k];
        dot += g[it][k] * n[it][k];
      }
    }
    if (row + gridDim.x < p.rows) load_row(row + gridDim.x);
    sum_g = block_sum_all(sum_g) * inv_width;
    dot = block_sum_all(dot) * inv_width;
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
      const int j = it * blockDim.x + threadIdx.x;
      if (j >= nvec) continue;
      float extra[V] = {};
      if (p.grad_h != nullptr) {
#pragma unroll
        for (int k = 0; k < V; ++k) extra[k] = to_float(gh[it].v[k]);
      }
      Pack<T, V> out;
#pragma unroll
      for (int k = 0; k < V; ++k) out.v[k] = from_float<T>(rstd * (g[it][k] - sum_g - n[it][k] * dot) + extra[k]);
      store_pack(static_cast<T*>(p.grad_x) + base, j, out);
    }
  }
  float* partial = p.weight_partials + static_cast<int64_t>(blockIdx.x) * 2 * p.width;
  store_column_partials(partial, nvec, acc_w);
  store_column_partials(partial + p.width, nvec, acc_b);
}

// One warp per row, kWarpRows rows per block in flight, no barrier per row (tiles: above). Each lane adds its
// columns' weight/bias terms into its warp's slice of shared memory, row after row in the warp's row order; the
// second pass reads the row again (L1/L2 hits) instead of holding it across the reduction. At the end the block's
// warps add their sums in warp order (deterministic) and write one [2, width] partial per block, as the block kernel
// does.
//
// A warp's slice holds [2][V / 4][nvec] float4s: the weight sums, then the bias sums, each vector j's V columns as
// V / 4 float4s nvec apart, so that a warp's lanes read and write consecutive 16-byte words (no bank conflicts).
template <int V>
__device__ __forceinline__ int column_sum_chunk(int nvec, int bias, int chunk, int j) {
  return (bias * (V / 4) + chunk) * nvec + j;
}

template <typename T, int ITERS>
__global__ void __launch_bounds__(kWarpRows * 32, kBwdWarpMinBlocks)
    layer_norm_bwd_warp_kernel(const LayerNormBwdParams p) {
  constexpr int V = kVec<T>;
  static_assert(V % 4 == 0, "a vector's columns are whole float4s");
  extern __shared__ float4 warp_sums[];  // per warp: [2][V / 4][nvec] float4 (column_sum_chunk)
  const int lane = static_cast<int>(threadIdx.x & 31), warp = static_cast<int>(threadIdx.x >> 5);
  const int nvec = static_cast<int>(p.width / V);
  const float inv_width = 1.f / static_cast<float>(p.width);
  const T* h_all = static_cast<const T*>(p.h);
  const T* gy_all = static_cast<const T*>(p.grad_y);
  float4* mine = warp_sums + warp * 2 * nvec * (V / 4);
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    const int j = it * 32 + lane;
    if (j >= nvec) continue;
#pragma unroll
    for (int bias = 0; bias < 2; ++bias) {
#pragma unroll
      for (int chunk = 0; chunk < V / 4; ++chunk) mine[column_sum_chunk<V>(nvec, bias, chunk, j)] = float4{};
    }
  }
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpRows;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpRows + warp; row < p.rows; row += warps) {
    const float mean = p.mean[row], rstd = p.rstd[row];
    const int64_t base = row * p.width;
    float sum_g = 0.f, dot = 0.f;
    {
      Pack<T, V> hp[ITERS], gp[ITERS];
#pragma unroll
      for (int it = 0; it < ITERS; ++it) {
        const int j = it * 32 + lane;
        if (j >= nvec) continue;
        hp[it] = load_pack(h_all + base, j);
        gp[it] = load_pack(gy_all + base, j);
      }
#pragma unroll
      for (int it = 0; it < ITERS; ++it) {
        const int j = it * 32 + lane;
        if (j >= nvec) continue;
        float w[V];
        load_param_vec<T, V>(p.weight, p.weight_t, j, w);
#pragma unroll
        for (int chunk = 0; chunk < V / 4; ++chunk) {
          float4& acc_w = mine[column_sum_chunk<V>(nvec, 0, chunk, j)];
          float4& acc_b = mine[column_sum_chunk<V>(nvec, 1, chunk, j)];
          float aw[4] = {acc_w.x, acc_w.y, acc_w.z, acc_w.w}, ab[4] = {acc_b.x, acc_b.y, acc_b.z, acc_b.w};
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int k = chunk * 4 + e;
            const float n = (to_float(hp[it].v[k]) - mean) * rstd;
            const float gy = to_float(gp[it].v[k]);
            const float g = gy * w[k];
            aw[e] += gy * n;
            ab[e] += gy;
            sum_g += g;
            dot += g * n;
          }
          acc_w = make_float4(aw[0], aw[1], aw[2], aw[3]);
          acc_b = make_float4(ab[0], ab[1], ab[2], ab[3]);
        }
      }
    }
    sum_g = warp_sum_all(sum_g) * inv_width;
    dot = warp_sum_all(dot) * inv_width;
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
      const int j = it * 32 + lane;
      if (j >= nvec) continue;
      const Pack<T, V> hp = load_pack(h_all + base, j);
      const Pack<T, V> gp = load_pack(gy_all + base, j);
      Pack<T, V> ghp;
      if (p.grad_h != nullptr) ghp = load_pack(static_cast<const T*>(p.grad_h) + base, j);
      float w[V];
      load_param_vec<T, V>(p.weight, p.weight_t, j, w);
      Pack<T, V> out;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float n = (to_float(hp.v[k]) - mean) * rstd;
        const float g = to_float(gp.v[k]) * w[k];
        const float extra = p.grad_h != nullptr ? to_float(ghp.v[k]) : 0.f;
        out.v[k] = from_float<T>(rstd * (g - sum_g - n * dot) + extra);
      }
      store_pack(static_cast<T*>(p.grad_x) + base, j, out);
    }
  }
  __syncthreads();
  float* partial = p.weight_partials + static_cast<int64_t>(blockIdx.x) * 2 * p.width;
  for (int64_t c = threadIdx.x; c < 2 * p.width; c += blockDim.x) {
    const int bias = static_cast<int>(c / p.width), column = static_cast<int>(c % p.width);
    const int j = column / V, k = column % V;
    const int chunk = column_sum_chunk<V>(nvec, bias, k / 4, j);
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < kWarpRows; ++w) {
      const float4 s = warp_sums[w * 2 * nvec * (V / 4) + chunk];
      sum += k % 4 == 0 ? s.x : k % 4 == 1 ? s.y : k % 4 == 2 ? s.z : s.w;
    }
    partial[c] = sum;
  }
}

size_t bwd_warp_smem(int64_t width) {
  return static_cast<size_t>(kWarpRows) * 2 * static_cast<size_t>(width) * sizeof(float);
}

// Calls f(kernel) with the backward warp kernel's instantiation for (dtype, iters).
template <typename F>
void with_bwd_warp_kernel(ActDtype dtype, int iters, F&& f) {
  auto typed = [&](auto zero) {
    using T = decltype(zero);
    if (iters == 2) {
      f(layer_norm_bwd_warp_kernel<T, 2>);
    } else if (iters == 4) {
      f(layer_norm_bwd_warp_kernel<T, 4>);
    } else {
      f(layer_norm_bwd_warp_kernel<T, kBwdWarpMaxIters>);
    }
  };
  if (dtype == ActDtype::kBf16) {
    typed(__nv_bfloat16{});
  } else {
    typed(0.0f);
  }
}

// Blocks of the backward warp kernel that are resident at once (per process and instantiation): the grid must not
// exceed them, or the last blocks' rows would run after everyone else's.
int64_t bwd_warp_grid(ActDtype dtype, int iters, int64_t width, int64_t rows) {
  int per_sm = 0;
  with_bwd_warp_kernel(dtype, iters, [&](auto kernel) {
    VLATUNE_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kWarpRows * 32, bwd_warp_smem(width)));
  });
  const int64_t resident = static_cast<int64_t>(std::max(per_sm, 1)) * fused_detail::sm_count();
  return std::max<int64_t>(1, std::min<int64_t>((rows + kWarpRows - 1) / kWarpRows, resident));
}

}  // namespace

bool layer_norm_supported(ActDtype dtype, int64_t width) {
  return width_ok(dtype, width);
}

int64_t layer_norm_bwd_blocks(ActDtype dtype, int64_t rows, int64_t width) {
  const int iters = warp_iters(true, dtype, width);
  return iters > 0 ? bwd_warp_grid(dtype, iters, width, rows) : norm_detail::bwd_blocks(rows);
}

void launch_layer_norm_fwd(const LayerNormFwdParams& p, CUstream_st* stream) {
  if (const int iters = warp_iters(false, p.dtype, p.width); iters > 0) {
    const auto blocks = static_cast<unsigned>((p.rows + kWarpRows - 1) / kWarpRows);
    auto launch = [&](auto zero, auto iters_c) {
      layer_norm_fwd_warp_kernel<decltype(zero), decltype(iters_c)::value><<<blocks, kWarpRows * 32, 0, stream>>>(p);
    };
    norm_frame("launch_layer_norm_fwd", "vlatune::layer_norm_fwd", p, p.rows, [&](auto zero) {
      if (iters == 2) {
        launch(zero, std::integral_constant<int, 2>{});
      } else if (iters == 4) {
        launch(zero, std::integral_constant<int, 4>{});
      } else if (iters == 5) {
        launch(zero, std::integral_constant<int, 5>{});
      } else {
        launch(zero, std::integral_constant<int, kWarpMaxIters>{});
      }
    });
    return;
  }
  launch_norm("launch_layer_norm_fwd", "vlatune::layer_norm_fwd", p, p.rows, [&](auto zero, auto iters, int threads) {
    layer_norm_fwd_kernel<decltype(zero), decltype(iters)::value>
        <<<static_cast<unsigned>(p.rows), threads, 0, stream>>>(p);
  });
}

void launch_layer_norm_bwd(const LayerNormBwdParams& p, CUstream_st* stream) {
  const auto blocks = static_cast<unsigned>(layer_norm_bwd_blocks(p.dtype, p.rows, p.width));
  if (const int iters = warp_iters(true, p.dtype, p.width); iters > 0) {
    const size_t smem = bwd_warp_smem(p.width);
    norm_frame("launch_layer_norm_bwd", "vlatune::layer_norm_bwd", p, p.rows, [&](auto) {
      with_bwd_warp_kernel(p.dtype, iters, [&](auto kernel) { kernel<<<blocks, kWarpRows * 32, smem, stream>>>(p); });
    });
    return;
  }
  launch_norm("launch_layer_norm_bwd", "vlatune::layer_norm_bwd", p, p.rows, [&](auto zero, auto iters, int threads) {
    layer_norm_bwd_kernel<decltype(zero), decltype(iters)::value><<<blocks, threads, 0, stream>>>(p);
  });
}

}  // namespace vlatune::kernels
