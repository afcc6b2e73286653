// Device helpers shared by the fused kernels (the norms, rope_qkv.cu, geglu.cu, gelu.cu, fp8_quant.cu, adamw.cu):
// 16-byte vector packs, fp32 conversion with ATen's rounding, tanh-GELU and its gradient, a block-wide sum, an NVTX
// range. Torch-free.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>

#include <cstdint>

#include "kernels/cuda_check.h"

namespace vlatune::kernels::fused_detail {

// N elements moved as one 16-byte access.
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};
template <typename T>
constexpr int kVec = 16 / static_cast<int>(sizeof(T));  // elements per 16-byte access: 8 bf16, 4 fp32

__device__ __forceinline__ float to_float(float x) {
  return x;
}
__device__ __forceinline__ float to_float(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);  // round to nearest even, as ATen's float -> bf16 conversion
}
// x rounded to T and back: where the unfused ATen sequence stores an intermediate in the activation dtype.
template <typename T>
__device__ __forceinline__ float round_to(float x) {
  return to_float(from_float<T>(x));
}
// round_to of two values in one conversion instruction (bf16: cvt.rn.bf16x2.f32): the same values, fewer
// instructions for the issue-bound fused casts.
template <typename T>
__device__ __forceinline__ float2 round_to2(float2 x) {
  return x;
}
template <>
__device__ __forceinline__ float2 round_to2<__nv_bfloat16>(float2 x) {
  return __bfloat1622float2(__float22bfloat162_rn(x));
}

template <typename T>
__device__ __forceinline__ Pack<T, kVec<T>> load_pack(const T* p, int64_t vec_index) {
  return reinterpret_cast<const Pack<T, kVec<T>>*>(p)[vec_index];
}
template <typename T>
__device__ __forceinline__ void store_pack(T* p, int64_t vec_index, const Pack<T, kVec<T>>& v) {
  reinterpret_cast<Pack<T, kVec<T>>*>(p)[vec_index] = v;
}

// ATen's gelu(approximate="tanh") in fp32 (aten/src/ATen/native/cuda/ActivationGeluKernel.cu) and its backward:
// the GeGLU/GELU kernels and the fused FP8 GeGLU casts share them, so their values agree bit for bit.
constexpr float kGeluBeta = 0.7978845608028654f;  // sqrt(2 / pi) = M_SQRT2 * M_2_SQRTPI * 0.5
constexpr float kGeluKappa = 0.044715f;

__device__ __forceinline__ float gelu_tanh(float x) {
  const float inner = kGeluBeta * (x + kGeluKappa * (x * x * x));
  return 0.5f * x * (1.f + tanhf(inner));
}

// gelu_tanh(x) and its derivative from one tanh: a backward that also rebuilds the activation computes one tanhf
// per element, not two. `value` is gelu_tanh(x) bit for bit; the inner sum is x + kappa * (x^2 * x) in both, as
// ATen's forward and backward compute it.
struct GeluTanhPair {
  float value, slope;
};

__device__ __forceinline__ GeluTanhPair gelu_tanh_pair(float x) {
  const float x_sq = x * x;
  const float inner = kGeluBeta * (x + kGeluKappa * (x_sq * x));
  const float t = tanhf(inner);
  const float left = 0.5f * x, right = 1.f + t;
  const float left_derivative = 0.5f * right;
  const float right_derivative = left * (1.f - t * t) * kGeluBeta * (1.f + 3.f * kGeluKappa * x_sq);
  return {left * right, left_derivative + right_derivative};
}

// Sum over the block, returned to every thread. Fixed order: deterministic. blockDim.x a multiple of 32, <= 1024.
// Two barriers; safe to call repeatedly in a loop.
__device__ __forceinline__ float block_sum_all(float x) {
  __shared__ float warp_sums[32];
  __shared__ float total;
  for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_down_sync(0xffffffffu, x, offset);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) warp_sums[warp] = x;
  __syncthreads();
  if (warp == 0) {
    x = lane < static_cast<int>(blockDim.x >> 5) ? warp_sums[lane] : 0.f;
    for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_down_sync(0xffffffffu, x, offset);
    if (lane == 0) total = x;
  }
  __syncthreads();
  // No third barrier: the next call writes `total` only after its first barrier, which every thread reaches
  // after reading this one.
  return total;
}

struct NvtxRange {
  explicit NvtxRange(const char* name) { nvtxRangePushA(name); }
  ~NvtxRange() { nvtxRangePop(); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

// Number of SMs of the current device (cached per process; the trainer uses one device per process).
inline int sm_count() {
  static const int count = [] {
    int device = 0, n = 0;
    VLATUNE_CUDA_CHECK(cudaGetDevice(&device));
    VLATUNE_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
    return n;
  }();
  return count;
}

// The tile choice of the streaming elementwise kernels (GeGLU, GELU): a grid-stride loop over 16-byte vectors,
// kStreamThreads threads, at most kStreamBlocksPerSm blocks per SM resident (pure streaming: the grid only has to
// cover the machine). SigLIP's GELU forward runs at 3.35 TB/s with it (16,384 x 4304 bf16, 0.084 ms; bench/RESULTS.md,
// BM_fused_gelu).
constexpr int kStreamThreads = 256;
constexpr int kStreamBlocksPerSm = 8;
inline int64_t stream_blocks(int64_t items) {
  const int64_t wanted = (items + kStreamThreads - 1) / kStreamThreads;
  const int64_t resident = static_cast<int64_t>(sm_count()) * kStreamBlocksPerSm;
  return wanted < 1 ? 1 : wanted < resident ? wanted : resident;
}

}  // namespace vlatune::kernels::fused_detail
