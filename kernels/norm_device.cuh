// What the three norm kernels (rms_norm.cu, adarms_norm.cu, layer_norm.cu) share: their row tiles, parameter reads
// and launcher frame. Torch-free.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/act_dtype.h"
#include "kernels/cuda_check.h"
#include "kernels/fused_device.cuh"

namespace vlatune::kernels::norm_detail {

using fused_detail::kVec;
using fused_detail::load_pack;
using fused_detail::NvtxRange;
using fused_detail::Pack;
using fused_detail::to_float;

// ---- Tile choices shared by the norms ----
// A block per row: a thread holds ITERS 16-byte vectors of the row in registers, so the row is read once: threads =
// the row's vectors rounded up to a warp, capped at 256 (Pi0.5: width 2048 bf16 = 256 vectors, one per thread;
// 1024 = 128 threads); ITERS = 1, 2 or 4 covers rows up to 1,024 vectors (8,192 bf16).
constexpr int kMaxThreads = 256;
constexpr int kMaxIters = 4;
// The backward kernels that accumulate parameter gradients per block (RMSNorm; LayerNorm's wide rows) run a
// grid-stride loop over rows with 4 blocks per SM: ~1,000 threads per SM in flight while the partials stay small
// ([4 * SMs, width] fp32, 4.3 MB at width 2048 on 132 SMs, summed by the caller). The RMSNorm backward runs 114 us
// per call at the backbone's shape in the H200 step (bench/RESULTS.md, seventh session).
constexpr int kBwdBlocksPerSm = 4;

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

inline bool width_ok(ActDtype dtype, int64_t width) {
  const int vec = dtype == ActDtype::kBf16 ? 8 : 4;
  return width > 0 && width % vec == 0 && width / vec <= static_cast<int64_t>(kMaxThreads) * kMaxIters;
}

inline int64_t bwd_blocks(int64_t rows) {
  return std::max<int64_t>(1,
                           std::min<int64_t>(rows, static_cast<int64_t>(fused_detail::sm_count()) * kBwdBlocksPerSm));
}

// ---- Parameter reads ----

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

// The gradient reaching a norm's h from its other uses (grad_h; null: none) at 16-byte vector j of the row at
// `base`, as floats (zeros without grad_h).
template <typename T, int V>
__device__ __forceinline__ void load_grad_h(const void* grad_h, int64_t base, int j, float (&out)[V]) {
  if (grad_h == nullptr) {
#pragma unroll
    for (int k = 0; k < V; ++k) out[k] = 0.f;
    return;
  }
  const Pack<T, V> g = load_pack(static_cast<const T*>(grad_h) + base, j);
#pragma unroll
  for (int k = 0; k < V; ++k) out[k] = to_float(g.v[k]);
}

// ---- Launchers ----

// The block kernels' end: a thread's per-column accumulators (acc[it][k] belongs to column (it * blockDim.x +
// threadIdx.x) * V + k) written into `row`, one fp32 row of the block's parameter-gradient partials.
template <int ITERS, int V>
__device__ __forceinline__ void store_column_partials(float* row, int nvec, const float (&acc)[ITERS][V]) {
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    const int j = it * blockDim.x + threadIdx.x;
    if (j >= nvec) continue;
#pragma unroll
    for (int k = 0; k < V; ++k) row[static_cast<int64_t>(j) * V + k] = acc[it][k];
  }
}

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

inline void check_width(const char* op, ActDtype dtype, int64_t width) {
  if (!width_ok(dtype, width))
    throw std::invalid_argument(std::string(op) + ": unsupported width " + std::to_string(width) +
                                " (a multiple of 16 bytes, at most 1,024 vectors; ask <op>_supported first)");
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

}  // namespace vlatune::kernels::norm_detail
