// Fused multi-tensor AdamW (full-precision state) and sum of squares (see adamw.h for the math, adamw.md for the
// design; the work split and its measured constants: adamw_launch.cuh).
// Torch-free: raw pointers, a stream, VLATUNE_CUDA_CHECK.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/adamw.h"
#include "kernels/adamw_launch.cuh"
#include "kernels/cuda_check.h"
#include "kernels/fused_device.cuh"

namespace vlatune::kernels {

namespace {

// Shared with the fused kernels: ATen's fp32 <-> bf16 rounding, the deterministic block sum (fixed order), NVTX.
using fused_detail::block_sum_all;
using fused_detail::from_float;
using fused_detail::NvtxRange;
using fused_detail::to_float;
using namespace adamw_detail;  // the work split, launch scalars and table loop shared with adamw_int8.cu

struct AdamwTable {
  void* p[kMaxTensors];
  const void* g[kMaxTensors];
  void* m[kMaxTensors];
  void* v[kMaxTensors];
  void* model[kMaxTensors];
  int64_t n[kMaxTensors];
  int32_t block_chunk[kMaxBlocks];
  uint8_t block_tensor[kMaxBlocks];
};

struct NormTable {
  const void* x[kMaxTensors];
  int64_t n[kMaxTensors];
  int32_t block_chunk[kMaxBlocks];
  uint8_t block_tensor[kMaxBlocks];
  int64_t partial_offset;
};

static_assert(sizeof(AdamwTable) + sizeof(AdamwScalars) <= 32000, "kernel parameters are limited to 32,764 B");
static_assert(sizeof(NormTable) + sizeof(float*) <= 32000, "kernel parameters are limited to 32,764 B");

// One element of the update, in fp32, in torch.optim.AdamW's order of operations.
__device__ __forceinline__ void adamw_element(float& p, float g, float& m, float& v, const AdamwScalars& s) {
  p *= s.decay;
  m = s.beta1 * m + s.one_minus_beta1 * g;
  v = s.beta2 * v + s.one_minus_beta2 * g * g;
  const float denom = sqrtf(v) / s.bc2_sqrt + s.eps;
  p -= s.step_size * (m / denom);
}

// P: parameter storage (master in kFp32Master), G: gradient, S: exp_avg/exp_avg_sq; kModel: also write the bf16
// model copy.
template <typename P, typename G, typename S, bool kModel>
__global__ void __launch_bounds__(kBlock)
    adamw_multi_tensor_kernel(const __grid_constant__ AdamwTable table, const AdamwScalars scalars) {
  AdamwScalars s;
  float scale;
  if (!resolve_scalars(scalars, s, scale)) return;  // non-finite clip coefficient: the step is skipped
  const int t = table.block_tensor[blockIdx.x];
  const int64_t start = static_cast<int64_t>(table.block_chunk[blockIdx.x]) * kChunk;
  const int n = static_cast<int>(min(static_cast<int64_t>(kChunk), table.n[t] - start));
  P* p = static_cast<P*>(table.p[t]) + start;
  const G* g = table.g[t] != nullptr ? static_cast<const G*>(table.g[t]) + start : nullptr;
  S* m = static_cast<S*>(table.m[t]) + start;
  S* v = static_cast<S*>(table.v[t]) + start;
  __nv_bfloat16* model = kModel ? static_cast<__nv_bfloat16*>(table.model[t]) + start : nullptr;

  int scalar_from = 0;
  if (vec_aligned<kVec>(p) && vec_aligned<kVec>(g) && vec_aligned<kVec>(m) && vec_aligned<kVec>(v) &&
      vec_aligned<kVec>(model)) {
    const int nvec = n / kVec;
    for (int j = threadIdx.x; j < nvec; j += blockDim.x) {
      Pack<P, kVec> pp = reinterpret_cast<const Pack<P, kVec>*>(p)[j];
      Pack<S, kVec> mp = reinterpret_cast<const Pack<S, kVec>*>(m)[j];
      Pack<S, kVec> vp = reinterpret_cast<const Pack<S, kVec>*>(v)[j];
      float gf[kVec] = {};
      if (g != nullptr) {
        const Pack<G, kVec> gp = reinterpret_cast<const Pack<G, kVec>*>(g)[j];
#pragma unroll
        for (int k = 0; k < kVec; ++k) gf[k] = to_float(gp.v[k]) * scale;
      }
      Pack<__nv_bfloat16, kVec> out;
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        float pf = to_float(pp.v[k]), mf = to_float(mp.v[k]), vf = to_float(vp.v[k]);
        adamw_element(pf, gf[k], mf, vf, s);
        pp.v[k] = from_float<P>(pf);
        mp.v[k] = from_float<S>(mf);
        vp.v[k] = from_float<S>(vf);
        if (kModel) out.v[k] = __float2bfloat16_rn(pf);
      }
      reinterpret_cast<Pack<P, kVec>*>(p)[j] = pp;
      reinterpret_cast<Pack<S, kVec>*>(m)[j] = mp;
      reinterpret_cast<Pack<S, kVec>*>(v)[j] = vp;
      if (kModel) reinterpret_cast<Pack<__nv_bfloat16, kVec>*>(model)[j] = out;
    }
    scalar_from = nvec * kVec;  // the tail of the last chunk of a tensor whose size is not a multiple of kVec
  }
  for (int i = scalar_from + threadIdx.x; i < n; i += blockDim.x) {
    float pf = to_float(p[i]), mf = to_float(m[i]), vf = to_float(v[i]);
    const float gf = g != nullptr ? to_float(g[i]) * scale : 0.f;
    adamw_element(pf, gf, mf, vf, s);
    p[i] = from_float<P>(pf);
    m[i] = from_float<S>(mf);
    v[i] = from_float<S>(vf);
    if (kModel) model[i] = __float2bfloat16_rn(pf);
  }
}

template <typename T>
__global__ void __launch_bounds__(kBlock)
    sum_squares_multi_tensor_kernel(const __grid_constant__ NormTable table, float* partials) {
  const int t = table.block_tensor[blockIdx.x];
  const int64_t start = static_cast<int64_t>(table.block_chunk[blockIdx.x]) * kChunk;
  const int n = static_cast<int>(min(static_cast<int64_t>(kChunk), table.n[t] - start));
  const T* x = static_cast<const T*>(table.x[t]) + start;
  float acc = 0.f;
  int scalar_from = 0;
  if (vec_aligned<kNormVec>(x)) {
    const int nvec = n / kNormVec;
    for (int j = threadIdx.x; j < nvec; j += blockDim.x) {
      const Pack<T, kNormVec> xp = reinterpret_cast<const Pack<T, kNormVec>*>(x)[j];
#pragma unroll
      for (int k = 0; k < kNormVec; ++k) {
        const float f = to_float(xp.v[k]);
        acc += f * f;
      }
    }
    scalar_from = nvec * kNormVec;
  }
  for (int i = scalar_from + threadIdx.x; i < n; i += blockDim.x) {
    const float f = to_float(x[i]);
    acc += f * f;
  }
  acc = block_sum_all(acc);
  if (threadIdx.x == 0) partials[table.partial_offset + blockIdx.x] = acc;
}

__global__ void __launch_bounds__(kFinalizeBlock)
    sum_partials_kernel(const float* partials, int64_t count, float* out) {
  float acc = 0.f;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) acc += partials[i];
  acc = block_sum_all(acc);
  if (threadIdx.x == 0) out[0] = acc;
}

template <AdamwStorage kStorage>
void launch_adamw_typed(const AdamwTensorList& list, const AdamwScalars& scalars, cudaStream_t stream) {
  using Types = StorageTypes<kStorage>;
  AdamwTable table;
  auto set_slot = [&](int slot, int64_t i) {
    table.p[slot] = list.params[i];
    table.g[slot] = list.grads[i];
    table.m[slot] = list.exp_avg[i];
    table.v[slot] = list.exp_avg_sq[i];
    table.model[slot] = Types::kModel ? list.model_bf16[i] : nullptr;
    return true;
  };
  auto launch = [&](int blocks) {
    adamw_multi_tensor_kernel<typename Types::Param, typename Types::Grad, typename Types::State, Types::kModel>
        <<<blocks, kBlock, 0, stream>>>(table, scalars);
    VLATUNE_CUDA_CHECK(cudaGetLastError());
  };
  for_each_launch(table, list.numels, list.count, set_slot, launch);
}

template <typename T>
void launch_sum_squares_typed(const void* const* tensors, const int64_t* numels, int64_t count, float* workspace,
                              float* out, cudaStream_t stream) {
  NormTable table;
  table.partial_offset = 0;
  auto set_slot = [&](int slot, int64_t i) {
    if (tensors[i] == nullptr) return false;  // a missing gradient adds nothing
    table.x[slot] = tensors[i];
    return true;
  };
  auto launch = [&](int blocks) {
    sum_squares_multi_tensor_kernel<T><<<blocks, kBlock, 0, stream>>>(table, workspace);
    VLATUNE_CUDA_CHECK(cudaGetLastError());
    table.partial_offset += blocks;
  };
  for_each_launch(table, numels, count, set_slot, launch);
  sum_partials_kernel<<<1, kFinalizeBlock, 0, stream>>>(workspace, table.partial_offset, out);
  VLATUNE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void launch_adamw_multi_tensor(AdamwStorage storage, const AdamwTensorList& list, const AdamwParams& params,
                               CUstream_st* stream) {
  launch_update("launch_adamw_multi_tensor", "vlatune::adamw", storage, list, params, /*int8_state=*/false,
                [&](auto st, const AdamwScalars& s) { launch_adamw_typed<decltype(st)::value>(list, s, stream); });
}

int64_t sum_squares_workspace_numel(const int64_t* numels, int64_t count) {
  int64_t total = 0;
  for (int64_t i = 0; i < count; ++i) total += chunks_of(numels[i]);
  return total > 0 ? total : 1;
}

void launch_sum_squares_multi_tensor(NormDtype dtype, const void* const* tensors, const int64_t* numels, int64_t count,
                                     float* workspace, float* out, CUstream_st* stream) {
  check_list("launch_sum_squares_multi_tensor", count, numels);
  if (out == nullptr || workspace == nullptr || (count > 0 && tensors == nullptr)) {
    throw std::invalid_argument("launch_sum_squares_multi_tensor: out, workspace or tensors is null");
  }
  NvtxRange range("vlatune::sum_squares");
  if (dtype == NormDtype::kFp32) {
    launch_sum_squares_typed<float>(tensors, numels, count, workspace, out, stream);
  } else {
    launch_sum_squares_typed<__nv_bfloat16>(tensors, numels, count, workspace, out, stream);
  }
}

}  // namespace vlatune::kernels
