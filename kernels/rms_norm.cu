// Gemma RMSNorm with the residual add fused: forward and backward (math in rms_norm.h, design in fused.md).
// Torch-free: raw pointers, a stream, VLATUNE_CUDA_CHECK.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda_check.h"
#include "kernels/fused_device.cuh"
#include "kernels/norm_device.cuh"
#include "kernels/rms_norm.h"

namespace vlatune::kernels {

using namespace fused_detail;
using namespace norm_detail;

namespace {

// Tile choices: a block per row (norm_detail::row_shape); the backward a grid-stride loop over rows,
// norm_detail::bwd_blocks(rows) blocks, each accumulating the weight gradient of its rows.

template <typename T, int ITERS>
__global__ void __launch_bounds__(kMaxThreads) rms_norm_fwd_kernel(const RmsNormFwdParams p) {
  constexpr int V = kVec<T>;
  const int64_t row = blockIdx.x;
  const int nvec = static_cast<int>(p.width / V);
  const T* x = static_cast<const T*>(p.x) + row * p.width;
  const T* d = p.delta != nullptr ? static_cast<const T*>(p.delta) + row * p.width : nullptr;
  float hv[ITERS][V];
  float ss = 0.f;
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    const int j = it * blockDim.x + threadIdx.x;
    if (j >= nvec) continue;
    Pack<T, V> xp = load_pack(x, j);
    if (d != nullptr) {
      const Pack<T, V> dp = load_pack(d, j);
#pragma unroll
      for (int k = 0; k < V; ++k) xp.v[k] = from_float<T>(to_float(xp.v[k]) + to_float(dp.v[k]));
      store_pack(static_cast<T*>(p.h) + row * p.width, j, xp);
    }
#pragma unroll
    for (int k = 0; k < V; ++k) {
      hv[it][k] = to_float(xp.v[k]);
      ss += hv[it][k] * hv[it][k];
    }
  }
  ss = block_sum_all(ss);
  const float rstd = rsqrtf(ss / static_cast<float>(p.width) + p.eps);
  if (threadIdx.x == 0) p.rstd[row] = rstd;
  T* y = static_cast<T*>(p.y) + row * p.width;
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    const int j = it * blockDim.x + threadIdx.x;
    if (j >= nvec) continue;
    float wv[V];
    load_param_vec<T, V>(p.weight, p.weight_t, j, wv);
    Pack<T, V> out;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float w = wv[k];
      out.v[k] = from_float<T>(__fmul_rn(hv[it][k] * rstd, w + 1.f));  // (h * rstd) * (1 + w), the reference's order
    }
    store_pack(y, j, out);
  }
}

// No next-row prefetch here: loading the next row (grad_h included) before the reduction, as the LayerNorm
// backward does, capped registers at 64 for 4 blocks per SM and ran 122 us per call at the backbone's shape in the
// step against 114 (bench/RESULTS.md, seventh session).
template <typename T, int ITERS>
__global__ void __launch_bounds__(kMaxThreads) rms_norm_bwd_kernel(const RmsNormBwdParams p) {
  constexpr int V = kVec<T>;
  const int nvec = static_cast<int>(p.width / V);
  const float inv_width = 1.f / static_cast<float>(p.width);
  float w1[ITERS][V], wacc[ITERS][V];
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    const int j = it * blockDim.x + threadIdx.x;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      w1[it][k] = j < nvec ? param_at<T>(p.weight, p.weight_t, static_cast<int64_t>(j) * V + k) + 1.f : 0.f;
      wacc[it][k] = 0.f;
    }
  }
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const float rstd = p.rstd[row];
    const int64_t base = row * p.width;
    float n[ITERS][V], g[ITERS][V];
    float dot = 0.f;
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
      const int j = it * blockDim.x + threadIdx.x;
      if (j >= nvec) continue;
      const Pack<T, V> hp = load_pack(static_cast<const T*>(p.h) + base, j);
      const Pack<T, V> gp = load_pack(static_cast<const T*>(p.grad_y) + base, j);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        n[it][k] = to_float(hp.v[k]) * rstd;
        const float gy = to_float(gp.v[k]);
        g[it][k] = gy * w1[it][k];
        wacc[it][k] += gy * n[it][k];
        dot += g[it][k] * n[it][k];
      }
    }
    dot = block_sum_all(dot) * inv_width;
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
      const int j = it * blockDim.x + threadIdx.x;
      if (j >= nvec) continue;
      float extra[V];
      load_grad_h<T, V>(p.grad_h, base, j, extra);
      Pack<T, V> out;
#pragma unroll
      for (int k = 0; k < V; ++k) out.v[k] = from_float<T>(rstd * (g[it][k] - n[it][k] * dot) + extra[k]);
      store_pack(static_cast<T*>(p.grad_x) + base, j, out);
    }
  }
  store_column_partials(p.weight_partials + static_cast<int64_t>(blockIdx.x) * p.width, nvec, wacc);
}

}  // namespace

bool rms_norm_supported(ActDtype dtype, int64_t width) {
  return width_ok(dtype, width);
}

int64_t rms_norm_bwd_blocks(int64_t rows) {
  return norm_detail::bwd_blocks(rows);
}

void launch_rms_norm_fwd(const RmsNormFwdParams& p, CUstream_st* stream) {
  launch_norm("launch_rms_norm_fwd", "vlatune::rms_norm_fwd", p, p.rows, [&](auto zero, auto iters, int threads) {
    rms_norm_fwd_kernel<decltype(zero), decltype(iters)::value>
        <<<static_cast<unsigned>(p.rows), threads, 0, stream>>>(p);
  });
}

void launch_rms_norm_bwd(const RmsNormBwdParams& p, CUstream_st* stream) {
  const auto blocks = static_cast<unsigned>(rms_norm_bwd_blocks(p.rows));
  launch_norm("launch_rms_norm_bwd", "vlatune::rms_norm_bwd", p, p.rows, [&](auto zero, auto iters, int threads) {
    rms_norm_bwd_kernel<decltype(zero), decltype(iters)::value><<<blocks, threads, 0, stream>>>(p);
  });
}

}  // namespace vlatune::kernels
