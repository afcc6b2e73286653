// adaRMS with the gated residual fused: forward and backward (math in adarms_norm.h, design in fused.md).
// Torch-free: raw pointers, a stream, VLATUNE_CUDA_CHECK.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/adarms_norm.h"
#include "kernels/cuda_check.h"
#include "kernels/fused_device.cuh"
#include "kernels/norm_device.cuh"

namespace vlatune::kernels {

using namespace fused_detail;
using namespace norm_detail;

namespace {

// Tile choices: the forward a block per row (norm_detail::row_shape). The backward a block per kRowsPerSplit
// tokens of one batch row, so Pi0.5's expert (32 x 50 tokens) runs 32 x 4 blocks and the scale/shift/gate sums leave
// as [splits, batch, 3, width] partials: a block per batch row alone would run 32 blocks on 132 SMs.
constexpr int kAdaRowsPerSplit = 16;

template <typename T, int ITERS>
__global__ void __launch_bounds__(kMaxThreads) adarms_norm_fwd_kernel(const AdaRmsNormFwdParams p) {
  constexpr int V = kVec<T>;
  const int64_t row = blockIdx.x;
  const int64_t b = row / p.tokens;
  const int nvec = static_cast<int>(p.width / V);
  const int64_t base = row * p.width;
  float hv[ITERS][V];
  float ss = 0.f;
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    const int j = it * blockDim.x + threadIdx.x;
    if (j >= nvec) continue;
    Pack<T, V> xp = load_pack(static_cast<const T*>(p.x) + base, j);
    if (p.delta != nullptr) {
      const Pack<T, V> dp = load_pack(static_cast<const T*>(p.delta) + base, j);
      const Pack<T, V> gp = load_pack(static_cast<const T*>(p.gate) + b * p.gate_stride, j);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float gd = round_to<T>(to_float(gp.v[k]) * to_float(dp.v[k]));
        xp.v[k] = from_float<T>(to_float(xp.v[k]) + gd);
      }
      store_pack(static_cast<T*>(p.h) + base, j, xp);
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
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    const int j = it * blockDim.x + threadIdx.x;
    if (j >= nvec) continue;
    const Pack<T, V> sc = load_pack(static_cast<const T*>(p.scale) + b * p.mod_stride, j);
    const Pack<T, V> sh = load_pack(static_cast<const T*>(p.shift) + b * p.mod_stride, j);
    Pack<T, V> out;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float scaled = __fmul_rn(hv[it][k] * rstd, to_float(sc.v[k]) + 1.f);
      out.v[k] = from_float<T>(__fadd_rn(scaled, to_float(sh.v[k])));
    }
    store_pack(static_cast<T*>(p.y) + base, j, out);
  }
}

template <typename T, int ITERS>
__global__ void __launch_bounds__(kMaxThreads) adarms_norm_bwd_kernel(const AdaRmsNormBwdParams p) {
  constexpr int V = kVec<T>;
  const int64_t b = blockIdx.y;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * kAdaRowsPerSplit;
  const int64_t t1 = t0 + kAdaRowsPerSplit < p.tokens ? t0 + kAdaRowsPerSplit : p.tokens;
  const int nvec = static_cast<int>(p.width / V);
  const float inv_width = 1.f / static_cast<float>(p.width);
  float s1[ITERS][V], gate[ITERS][V], acc_scale[ITERS][V], acc_shift[ITERS][V], acc_gate[ITERS][V];
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    const int j = it * blockDim.x + threadIdx.x;
    Pack<T, V> sc{}, gt{};
    if (j < nvec) {
      sc = load_pack(static_cast<const T*>(p.scale) + b * p.mod_stride, j);
      if (p.delta != nullptr) gt = load_pack(static_cast<const T*>(p.gate) + b * p.gate_stride, j);
    }
#pragma unroll
    for (int k = 0; k < V; ++k) {
      s1[it][k] = to_float(sc.v[k]) + 1.f;
      gate[it][k] = p.delta != nullptr ? to_float(gt.v[k]) : 0.f;
      acc_scale[it][k] = acc_shift[it][k] = acc_gate[it][k] = 0.f;
    }
  }
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t row = b * p.tokens + t;
    const int64_t base = row * p.width;
    const float rstd = p.rstd[row];
    float n[ITERS][V], g[ITERS][V], dv[ITERS][V];
    float dot = 0.f;
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
      const int j = it * blockDim.x + threadIdx.x;
      if (j >= nvec) continue;
      const Pack<T, V> xp = load_pack(static_cast<const T*>(p.x) + base, j);
      const Pack<T, V> gp = load_pack(static_cast<const T*>(p.grad_y) + base, j);
      Pack<T, V> dp{};
      if (p.delta != nullptr) dp = load_pack(static_cast<const T*>(p.delta) + base, j);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        float h = to_float(xp.v[k]);
        if (p.delta != nullptr) {
          dv[it][k] = to_float(dp.v[k]);
          h = round_to<T>(h + round_to<T>(gate[it][k] * dv[it][k]));  // the forward's h, bit for bit
        }
        n[it][k] = h * rstd;
        const float gy = to_float(gp.v[k]);
        g[it][k] = gy * s1[it][k];
        acc_scale[it][k] += gy * n[it][k];
        acc_shift[it][k] += gy;
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
      Pack<T, V> gx, gd;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float dh = rstd * (g[it][k] - n[it][k] * dot) + extra[k];
        gx.v[k] = from_float<T>(dh);
        if (p.delta != nullptr) {
          gd.v[k] = from_float<T>(dh * gate[it][k]);
          acc_gate[it][k] += dh * dv[it][k];
        }
      }
      store_pack(static_cast<T*>(p.grad_x) + base, j, gx);
      if (p.delta != nullptr) store_pack(static_cast<T*>(p.grad_delta) + base, j, gd);
    }
  }
  // partials[split][b][0..2][:]
  float* out = p.partials + ((static_cast<int64_t>(blockIdx.x) * p.batch + b) * 3) * p.width;
  store_column_partials(out, nvec, acc_scale);
  store_column_partials(out + p.width, nvec, acc_shift);
  store_column_partials(out + 2 * p.width, nvec, acc_gate);
}

}  // namespace

bool adarms_norm_supported(ActDtype dtype, int64_t width) {
  return width_ok(dtype, width);
}

int64_t adarms_norm_bwd_splits(int64_t tokens) {
  return std::max<int64_t>(1, (tokens + kAdaRowsPerSplit - 1) / kAdaRowsPerSplit);
}

void launch_adarms_norm_fwd(const AdaRmsNormFwdParams& p, CUstream_st* stream) {
  const auto rows = static_cast<unsigned>(p.batch * p.tokens);
  launch_norm("launch_adarms_norm_fwd", "vlatune::adarms_norm_fwd", p, p.batch * p.tokens,
              [&](auto zero, auto iters, int threads) {
                adarms_norm_fwd_kernel<decltype(zero), decltype(iters)::value><<<rows, threads, 0, stream>>>(p);
              });
}

void launch_adarms_norm_bwd(const AdaRmsNormBwdParams& p, CUstream_st* stream) {
  const dim3 grid(static_cast<unsigned>(adarms_norm_bwd_splits(p.tokens)), static_cast<unsigned>(p.batch));
  launch_norm("launch_adarms_norm_bwd", "vlatune::adarms_norm_bwd", p, p.batch * p.tokens,
              [&](auto zero, auto iters, int threads) {
                adarms_norm_bwd_kernel<decltype(zero), decltype(iters)::value><<<grid, threads, 0, stream>>>(p);
              });
}

}  // namespace vlatune::kernels
