// RMSNorm, adaRMS and LayerNorm with the residual add fused: forward and backward (math in fused.h, design in
// fused.md). Torch-free: raw pointers, a stream, VLATUNE_CUDA_CHECK.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/cuda_check.h"
#include "kernels/fused.h"
#include "kernels/fused_device.cuh"

namespace vlatune::kernels {

using fused_detail::block_sum_all;
using fused_detail::from_float;
using fused_detail::kVec;
using fused_detail::load_pack;
using fused_detail::NvtxRange;
using fused_detail::Pack;
using fused_detail::round_to;
using fused_detail::store_pack;
using fused_detail::to_float;

namespace fused_detail {
int sm_count() {
  static const int count = [] {
    int device = 0, n = 0;
    VLATUNE_CUDA_CHECK(cudaGetDevice(&device));
    VLATUNE_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
    return n;
  }();
  return count;
}
}  // namespace fused_detail

namespace {

// Work split: one block per row (forward) or a grid-stride over rows (RMSNorm backward, which accumulates the
// weight gradient per block). A thread holds ITERS 16-byte vectors of the row in registers, so the row is read
// once: threads = the row's vectors rounded up to a warp, capped at 256 (Pi0.5: width 2048 bf16 = 256 vectors,
// one per thread; 1024 = 128 threads); ITERS = 1, 2 or 4 covers rows up to 1,024 vectors (8,192 bf16).
constexpr int kMaxThreads = 256;
constexpr int kMaxIters = 4;
// The RMSNorm backward grid: 4 blocks per SM keep ~1,000 threads per SM in flight while the weight-gradient
// partials stay small ([4 * SMs, width] fp32, 4.3 MB at width 2048 on 132 SMs, summed by the caller).
constexpr int kBwdBlocksPerSm = 4;
// adaRMS backward: a block takes kAdaRowsPerSplit tokens of one batch row, so Pi0.5's expert (32 x 50 tokens)
// runs 32 x 4 blocks; the scale/shift/gate sums leave as [splits, batch, 3, width] partials.
constexpr int kAdaRowsPerSplit = 16;

// A parameter vector's 16-byte vector j (V elements) as floats: from `in_t` (the activation dtype T: one 16-byte
// load) when set, else from the fp32 copy (V / 4 loads).
template <typename T, int V>
__device__ __forceinline__ void load_param_vec(const float* fp32, const void* in_t, int j, float (&out)[V]) {
  if (in_t != nullptr) {
    const Pack<T, V> v = load_pack(static_cast<const T*>(in_t), j);
#pragma unroll
    for (int k = 0; k < V; ++k) out[k] = to_float(v.v[k]);
    return;
  }
  const Pack<float, 4>* w4 = reinterpret_cast<const Pack<float, 4>*>(fp32 + static_cast<int64_t>(j) * V);
#pragma unroll
  for (int k = 0; k < V; ++k) out[k] = w4[k / 4].v[k % 4];
}

// One element of a parameter vector, from `in_t` (activation dtype T) when set, else from the fp32 copy.
template <typename T>
__device__ __forceinline__ float param_at(const float* fp32, const void* in_t, int64_t i) {
  return in_t != nullptr ? to_float(static_cast<const T*>(in_t)[i]) : fp32[i];
}

struct RowShape {
  int threads, iters;
};

template <typename T>
RowShape row_shape(int64_t width) {
  const int64_t nvec = width / kVec<T>;
  int threads = static_cast<int>(std::min<int64_t>((nvec + 31) / 32 * 32, kMaxThreads));
  int iters = static_cast<int>((nvec + threads - 1) / threads);
  if (iters == 3) iters = 4;
  return {threads, iters};
}

bool width_ok(ActDtype dtype, int64_t width) {
  const int vec = dtype == ActDtype::kBf16 ? 8 : 4;
  return width > 0 && width % vec == 0 && width / vec <= static_cast<int64_t>(kMaxThreads) * kMaxIters;
}

// ------------------------------------------------------------------------------------------------ RMSNorm

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
      float extra[V] = {};
      if (p.grad_h != nullptr) {
        const Pack<T, V> ghp = load_pack(static_cast<const T*>(p.grad_h) + base, j);
#pragma unroll
        for (int k = 0; k < V; ++k) extra[k] = to_float(ghp.v[k]);
      }
      Pack<T, V> out;
#pragma unroll
      for (int k = 0; k < V; ++k) out.v[k] = from_float<T>(rstd * (g[it][k] - n[it][k] * dot) + extra[k]);
      store_pack(static_cast<T*>(p.grad_x) + base, j, out);
    }
  }
  float* partial = p.weight_partials + static_cast<int64_t>(blockIdx.x) * p.width;
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    const int j = it * blockDim.x + threadIdx.x;
    if (j >= nvec) continue;
#pragma unroll
    for (int k = 0; k < V; ++k) partial[static_cast<int64_t>(j) * V + k] = wacc[it][k];
  }
}

// ------------------------------------------------------------------------------------------------ adaRMS

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
      float extra[V] = {};
      if (p.grad_h != nullptr) {
        const Pack<T, V> ghp = load_pack(static_cast<const T*>(p.grad_h) + base, j);
#pragma unroll
        for (int k = 0; k < V; ++k) extra[k] = to_float(ghp.v[k]);
      }
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
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    const int j = it * blockDim.x + threadIdx.x;
    if (j >= nvec) continue;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const int64_t c = static_cast<int64_t>(j) * V + k;
      out[c] = acc_scale[it][k];
      out[p.width + c] = acc_shift[it][k];
      out[2 * p.width + c] = acc_gate[it][k];
    }
  }
}

// ------------------------------------------------------------------------------------------------ LayerNorm

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

// One warp per row for rows of at most 32 * kWarpMaxIters vectors (SigLIP: 1152 bf16 = 144 vectors, 4.5 per
// lane), kWarpRows rows per block: shuffles instead of block barriers. The block-per-row kernel ran SigLIP's
// LayerNorm at 2.5 TB/s of the 4.3 the H200 copies at (61 us per call at batch 32; RESULTS "fourth session"): its
// two block reductions per 2.3 KB row were latency, not bandwidth.
constexpr int kWarpRows = 4;
constexpr int kWarpMaxIters = 8;

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
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    const int j = it * blockDim.x + threadIdx.x;
    if (j >= nvec) continue;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      partial[static_cast<int64_t>(j) * V + k] = acc_w[it][k];
      partial[p.width + static_cast<int64_t>(j) * V + k] = acc_b[it][k];
    }
  }
}

// One warp per row (rows of at most 32 * kBwdWarpMaxIters vectors: SigLIP's 1152 bf16 = 144 vectors, 4.5 per lane),
// kWarpRows rows per block in flight, no barrier per row. The block-per-row kernel above ran SigLIP's shape at 121 us
// per call in the step (1.25 TB/s; profile of 2026-12-01): two block reductions per 2.3 KB row, one row per block at
// a time. Each lane keeps its columns' weight/bias sums in registers (2 x 40 floats at SigLIP's width), so the
// second pass reads the row again (L1/L2 hits) instead of holding it across the reduction: three blocks per SM
// stay resident (168 registers, 116 bytes per thread spilled at SigLIP's width; 255 registers without the cap). At the
// end the block's warps add their sums in shared memory in warp order (deterministic) and write one [2, width] partial
// per block, as the block kernel does.
constexpr int kBwdWarpMaxIters = 5;
constexpr int kBwdWarpMinBlocks = 3;

template <typename T, int ITERS>
__global__ void __launch_bounds__(kWarpRows * 32, kBwdWarpMinBlocks)
    layer_norm_bwd_warp_kernel(const LayerNormBwdParams p) {
  constexpr int V = kVec<T>;
  extern __shared__ float warp_sums[];  // [kWarpRows][2][width]
  const int lane = static_cast<int>(threadIdx.x & 31), warp = static_cast<int>(threadIdx.x >> 5);
  const int nvec = static_cast<int>(p.width / V);
  const float inv_width = 1.f / static_cast<float>(p.width);
  const T* h_all = static_cast<const T*>(p.h);
  const T* gy_all = static_cast<const T*>(p.grad_y);
  float acc_w[ITERS][V], acc_b[ITERS][V];
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
#pragma unroll
    for (int k = 0; k < V; ++k) acc_w[it][k] = acc_b[it][k] = 0.f;
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
        for (int k = 0; k < V; ++k) {
          const float n = (to_float(hp[it].v[k]) - mean) * rstd;
          const float gy = to_float(gp[it].v[k]);
          const float g = gy * w[k];
          acc_w[it][k] += gy * n;
          acc_b[it][k] += gy;
          sum_g += g;
          dot += g * n;
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
  float* mine = warp_sums + static_cast<int64_t>(warp) * 2 * p.width;
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    const int j = it * 32 + lane;
    if (j >= nvec) continue;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      mine[j * V + k] = acc_w[it][k];
      mine[p.width + j * V + k] = acc_b[it][k];
    }
  }
  __syncthreads();
  float* partial = p.weight_partials + static_cast<int64_t>(blockIdx.x) * 2 * p.width;
  for (int64_t c = threadIdx.x; c < 2 * p.width; c += blockDim.x) {
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < kWarpRows; ++w) sum += warp_sums[w * 2 * p.width + c];
    partial[c] = sum;
  }
}

// ------------------------------------------------------------------------------------------------ launchers

template <typename T, typename Params, typename Launch>
void dispatch_iters(const Params& p, Launch&& launch) {
  const RowShape s = row_shape<T>(p.width);
  switch (s.iters) {
    case 1:
      launch(std::integral_constant<int, 1>{}, s.threads);
      break;
    case 2:
      launch(std::integral_constant<int, 2>{}, s.threads);
      break;
    default:
      launch(std::integral_constant<int, 4>{}, s.threads);
      break;
  }
}

void check_width(const char* op, ActDtype dtype, int64_t width) {
  if (!width_ok(dtype, width))
    throw std::invalid_argument(std::string(op) + ": unsupported width " + std::to_string(width) +
                                " (a multiple of 16 bytes, at most 4,096 vectors; call rms_norm_supported first)");
}

// Every launcher's frame: the width check, nothing for no rows, an NVTX range ("vlatune::<op>"), the dtype's
// instantiation, and the launch check. typed(zero) launches the kernel for T = decltype(zero).
template <typename Params, typename Typed>
void norm_frame(const char* op, const char* range_name, const Params& p, int64_t rows, Typed&& typed) {
  check_width(op, p.dtype, p.width);
  if (rows == 0) return;
  NvtxRange range(range_name);
  if (p.dtype == ActDtype::kBf16) {
    typed(__nv_bfloat16{});
  } else {
    typed(0.0f);
  }
  VLATUNE_CUDA_CHECK(cudaGetLastError());
}

// The frame for the block-per-row kernels, at the iteration count dispatch_iters picks for the width.
// launch(zero, iters, threads) launches the kernel for T = decltype(zero).
template <typename Params, typename Launch>
void launch_norm(const char* op, const char* range_name, const Params& p, int64_t rows, Launch&& launch) {
  norm_frame(op, range_name, p, rows, [&](auto zero) {
    dispatch_iters<decltype(zero)>(p, [&](auto iters, int threads) { launch(zero, iters, threads); });
  });
}

}  // namespace

bool layer_norm_supported(ActDtype dtype, int64_t width) {
  return width_ok(dtype, width);
}

namespace {

// The warp backward's vectors per lane for this width (2, 4 or 5), or 0 when the block kernel runs it.
int layer_norm_bwd_warp_iters(ActDtype dtype, int64_t width) {
  if (!width_ok(dtype, width)) return 0;
  const int vec = dtype == ActDtype::kBf16 ? kVec<__nv_bfloat16> : kVec<float>;
  const int64_t lane_iters = (width / vec + 31) / 32;
  if (lane_iters <= 2) return 2;
  if (lane_iters <= 4) return 4;
  return lane_iters <= kBwdWarpMaxIters ? kBwdWarpMaxIters : 0;
}

size_t layer_norm_bwd_warp_smem(int64_t width) {
  return static_cast<size_t>(kWarpRows) * 2 * static_cast<size_t>(width) * sizeof(float);
}

// Calls f(kernel) with the warp kernel's instantiation for (dtype, iters).
template <typename F>
void with_layer_norm_bwd_warp_kernel(ActDtype dtype, int iters, F&& f) {
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

// Blocks of the warp backward that are resident at once (per process and instantiation): the grid must not exceed
// them, or the last blocks' rows would run after everyone else's.
int64_t layer_norm_bwd_warp_grid(ActDtype dtype, int iters, int64_t width, int64_t rows) {
  int per_sm = 0;
  with_layer_norm_bwd_warp_kernel(dtype, iters, [&](auto kernel) {
    VLATUNE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kWarpRows * 32,
                                                                     layer_norm_bwd_warp_smem(width)));
  });
  const int64_t resident = static_cast<int64_t>(std::max(per_sm, 1)) * fused_detail::sm_count();
  return std::max<int64_t>(1, std::min<int64_t>((rows + kWarpRows - 1) / kWarpRows, resident));
}

}  // namespace

int64_t layer_norm_bwd_blocks(ActDtype dtype, int64_t rows, int64_t width) {
  const int iters = layer_norm_bwd_warp_iters(dtype, width);
  return iters > 0 ? layer_norm_bwd_warp_grid(dtype, iters, width, rows) : rms_norm_bwd_blocks(rows);
}

void launch_layer_norm_fwd(const LayerNormFwdParams& p, CUstream_st* stream) {
  const int vec = p.dtype == ActDtype::kBf16 ? kVec<__nv_bfloat16> : kVec<float>;
  const int64_t lane_iters = (p.width / vec + 31) / 32;
  if (width_ok(p.dtype, p.width) && lane_iters <= kWarpMaxIters) {
    // One warp per row; the instantiations cover 2, 4, 5 (SigLIP) and 8 vectors per lane.
    const auto blocks = static_cast<unsigned>((p.rows + kWarpRows - 1) / kWarpRows);
    auto launch = [&](auto zero, auto iters) {
      layer_norm_fwd_warp_kernel<decltype(zero), decltype(iters)::value><<<blocks, kWarpRows * 32, 0, stream>>>(p);
    };
    norm_frame("launch_layer_norm_fwd", "vlatune::layer_norm_fwd", p, p.rows, [&](auto zero) {
      if (lane_iters <= 2) {
        launch(zero, std::integral_constant<int, 2>{});
      } else if (lane_iters <= 4) {
        launch(zero, std::integral_constant<int, 4>{});
      } else if (lane_iters == 5) {
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
  if (const int iters = layer_norm_bwd_warp_iters(p.dtype, p.width); iters > 0) {
    const size_t smem = layer_norm_bwd_warp_smem(p.width);
    norm_frame("launch_layer_norm_bwd", "vlatune::layer_norm_bwd", p, p.rows, [&](auto) {
      with_layer_norm_bwd_warp_kernel(p.dtype, iters,
                                      [&](auto kernel) { kernel<<<blocks, kWarpRows * 32, smem, stream>>>(p); });
    });
    return;
  }
  launch_norm("launch_layer_norm_bwd", "vlatune::layer_norm_bwd", p, p.rows, [&](auto zero, auto iters, int threads) {
    layer_norm_bwd_kernel<decltype(zero), decltype(iters)::value><<<blocks, threads, 0, stream>>>(p);
  });
}

bool rms_norm_supported(ActDtype dtype, int64_t width) {
  return width_ok(dtype, width);
}

int64_t rms_norm_bwd_blocks(int64_t rows) {
  return std::max<int64_t>(1,
                           std::min<int64_t>(rows, static_cast<int64_t>(fused_detail::sm_count()) * kBwdBlocksPerSm));
}

int64_t adarms_norm_bwd_splits(int64_t tokens) {
  return std::max<int64_t>(1, (tokens + kAdaRowsPerSplit - 1) / kAdaRowsPerSplit);
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
