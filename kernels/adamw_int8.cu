// Fused multi-tensor AdamW with 8-bit blockwise state (adamw.h: launch_adamw_int8_multi_tensor; the design:
// adamw.md "8-bit state"). One pass per element: read the parameter, the gradient and both uint8 codes, dequantize,
// update in fp32, requantize with the block's new absmax, write parameter (and model copy) and codes.
// Torch-free: raw pointers, a stream, VLATUNE_CUDA_CHECK.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/adamw.h"
#include "kernels/adamw_int8_math.h"
#include "kernels/adamw_launch.cuh"
#include "kernels/cuda_check.h"
#include "kernels/fused_device.cuh"

namespace vlatune::kernels {

namespace {

using fused_detail::from_float;
using fused_detail::to_float;
using namespace adamw_detail;

// Work split inside a chunk: a warp owns one quantization block (256 elements, 8 per lane), so the block's absmax
// is a warp reduction (shuffles, no barrier) and no block straddles two warps. Chunks (64 Ki) hold whole blocks.
constexpr int kLaneElems = static_cast<int>(kAdamwQuantBlock) / 32;
constexpr int kWarps = kBlock / 32;
static_assert(kLaneElems == 8, "a lane owns 8 elements: 16 B of bf16, 8 B of codes");
static_assert(kChunk % kAdamwQuantBlock == 0, "quantization blocks never straddle chunks");

struct AdamwInt8Table {
  void* p[kMaxTensors];
  const void* g[kMaxTensors];
  uint8_t* m[kMaxTensors];
  uint8_t* v[kMaxTensors];
  float* m_absmax[kMaxTensors];
  float* v_absmax[kMaxTensors];
  void* model[kMaxTensors];
  int64_t n[kMaxTensors];
  int32_t block_chunk[kMaxBlocks];
  uint8_t block_tensor[kMaxBlocks];
  float m_code[256];  // AdamwQuantMaps, copied into shared memory by each block
  float v_code[256];
};
static_assert(sizeof(AdamwInt8Table) + sizeof(AdamwScalars) <= 32000, "kernel parameters are limited to 32,764 B");

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

// P: parameter storage (master in kFp32Master), G: gradient; kModel: also write the bf16 model copy.
template <typename P, typename G, bool kModel>
__global__ void __launch_bounds__(kBlock)
    adamw_int8_multi_tensor_kernel(const __grid_constant__ AdamwInt8Table table, const AdamwScalars scalars) {
  AdamwScalars s;
  float scale;
  if (!resolve_scalars(scalars, s, scale)) return;  // non-finite clip coefficient: the step is skipped
  const int8_math::UpdateScalars us{s.beta1, s.one_minus_beta1, s.beta2,     s.one_minus_beta2,
                                    s.eps,   s.decay,           s.step_size, s.bc2_sqrt};

  // Code points and midpoints in shared memory: the lookups are data-dependent (a constant-bank read would
  // serialize across the warp).
  __shared__ float m_code[256], v_code[256], m_mid[256], v_mid[256];
  for (int i = threadIdx.x; i < 256; i += blockDim.x) {
    m_code[i] = table.m_code[i];
    v_code[i] = table.v_code[i];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < 256; i += blockDim.x) {
    m_mid[i] = int8_math::code_midpoint(m_code, i);
    v_mid[i] = int8_math::code_midpoint(v_code, i);
  }
  __syncthreads();

  const int t = table.block_tensor[blockIdx.x];
  const int64_t start = static_cast<int64_t>(table.block_chunk[blockIdx.x]) * kChunk;
  const int n = static_cast<int>(min(static_cast<int64_t>(kChunk), table.n[t] - start));
  P* p = static_cast<P*>(table.p[t]) + start;
  const G* g = table.g[t] != nullptr ? static_cast<const G*>(table.g[t]) + start : nullptr;
  uint8_t* mq = table.m[t] + start;
  uint8_t* vq = table.v[t] + start;
  float* m_absmax = table.m_absmax[t] + start / kAdamwQuantBlock;
  float* v_absmax = table.v_absmax[t] + start / kAdamwQuantBlock;
  __nv_bfloat16* model = kModel ? static_cast<__nv_bfloat16*>(table.model[t]) + start : nullptr;
  const bool aligned = vec_aligned<kLaneElems>(p) && vec_aligned<kLaneElems>(g) && vec_aligned<kLaneElems>(mq) &&
                       vec_aligned<kLaneElems>(vq) && vec_aligned<kLaneElems>(model);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int blocks = static_cast<int>((n + kAdamwQuantBlock - 1) / kAdamwQuantBlock);
  for (int b = warp; b < blocks; b += kWarps) {
    const int first = b * static_cast<int>(kAdamwQuantBlock) + lane * kLaneElems;
    const int count = max(0, min(kLaneElems, n - first));
    const bool vec = aligned && count == kLaneElems;
    float pf[kLaneElems], gf[kLaneElems], mf[kLaneElems], vf[kLaneElems];
    uint8_t mc[kLaneElems], vc[kLaneElems];
    if (vec) {
      const Pack<P, kLaneElems> pp = reinterpret_cast<const Pack<P, kLaneElems>*>(p + first)[0];
      const Pack<uint8_t, kLaneElems> mp = reinterpret_cast<const Pack<uint8_t, kLaneElems>*>(mq + first)[0];
      const Pack<uint8_t, kLaneElems> vp = reinterpret_cast<const Pack<uint8_t, kLaneElems>*>(vq + first)[0];
#pragma unroll
      for (int k = 0; k < kLaneElems; ++k) pf[k] = to_float(pp.v[k]), mc[k] = mp.v[k], vc[k] = vp.v[k], gf[k] = 0.f;
      if (g != nullptr) {
        const Pack<G, kLaneElems> gp = reinterpret_cast<const Pack<G, kLaneElems>*>(g + first)[0];
#pragma unroll
        for (int k = 0; k < kLaneElems; ++k) gf[k] = to_float(gp.v[k]);
      }
    } else {
#pragma unroll
      for (int k = 0; k < kLaneElems; ++k) {
        const bool in = k < count;
        pf[k] = in ? to_float(p[first + k]) : 0.f;
        gf[k] = in && g != nullptr ? to_float(g[first + k]) : 0.f;
        mc[k] = in ? mq[first + k] : 0;
        vc[k] = in ? vq[first + k] : 0;
      }
    }

    // Dequantize, update; the new absmax of the block over its valid elements.
    const float m_scale = m_absmax[b], v_scale = v_absmax[b];
    float m_max = 0.f, v_max = 0.f;
#pragma unroll
    for (int k = 0; k < kLaneElems; ++k) {
      if (k >= count) break;
      mf[k] = int8_math::mul(m_code[mc[k]], m_scale);
      vf[k] = int8_math::mul(v_code[vc[k]], v_scale);
      int8_math::adamw_element(pf[k], int8_math::mul(gf[k], scale), mf[k], vf[k], us);
      m_max = fmaxf(m_max, fabsf(mf[k]));
      v_max = fmaxf(v_max, vf[k]);
    }
    m_max = warp_max(m_max);
    v_max = warp_max(v_max);
    const float m_inv = int8_math::inverse_absmax(m_max), v_inv = int8_math::inverse_absmax(v_max);
#pragma unroll
    for (int k = 0; k < kLaneElems; ++k) {
      if (k >= count) break;
      mc[k] = int8_math::quantize_index(m_mid, int8_math::mul(mf[k], m_inv));
      vc[k] = int8_math::quantize_index(v_mid, int8_math::mul(vf[k], v_inv));
    }
    if (lane == 0) {
      m_absmax[b] = m_max;
      v_absmax[b] = v_max;
    }

    if (vec) {
      Pack<P, kLaneElems> pp;
      Pack<uint8_t, kLaneElems> mp, vp;
      Pack<__nv_bfloat16, kLaneElems> out;
#pragma unroll
      for (int k = 0; k < kLaneElems; ++k) {
        pp.v[k] = from_float<P>(pf[k]);
        mp.v[k] = mc[k];
        vp.v[k] = vc[k];
        if (kModel) out.v[k] = __float2bfloat16_rn(pf[k]);
      }
      reinterpret_cast<Pack<P, kLaneElems>*>(p + first)[0] = pp;
      reinterpret_cast<Pack<uint8_t, kLaneElems>*>(mq + first)[0] = mp;
      reinterpret_cast<Pack<uint8_t, kLaneElems>*>(vq + first)[0] = vp;
      if (kModel) reinterpret_cast<Pack<__nv_bfloat16, kLaneElems>*>(model + first)[0] = out;
    } else {
      for (int k = 0; k < count; ++k) {
        p[first + k] = from_float<P>(pf[k]);
        mq[first + k] = mc[k];
        vq[first + k] = vc[k];
        if (kModel) model[first + k] = __float2bfloat16_rn(pf[k]);
      }
    }
  }
}

template <AdamwStorage kStorage>
void launch_int8_typed(const AdamwTensorList& list, const AdamwScalars& scalars, cudaStream_t stream) {
  using Types = StorageTypes<kStorage>;
  AdamwInt8Table table;
  const AdamwQuantMaps& maps = adamw_quant_maps();
  for (int i = 0; i < 256; ++i) {
    table.m_code[i] = maps.exp_avg[i];
    table.v_code[i] = maps.exp_avg_sq[i];
  }
  auto set_slot = [&](int slot, int64_t i) {
    table.p[slot] = list.params[i];
    table.g[slot] = list.grads[i];
    table.m[slot] = static_cast<uint8_t*>(list.exp_avg[i]);
    table.v[slot] = static_cast<uint8_t*>(list.exp_avg_sq[i]);
    table.m_absmax[slot] = list.exp_avg_absmax[i];
    table.v_absmax[slot] = list.exp_avg_sq_absmax[i];
    table.model[slot] = Types::kModel ? list.model_bf16[i] : nullptr;
    return true;
  };
  auto launch = [&](int blocks) {
    adamw_int8_multi_tensor_kernel<typename Types::Param, typename Types::Grad, Types::kModel>
        <<<blocks, kBlock, 0, stream>>>(table, scalars);
    VLATUNE_CUDA_CHECK(cudaGetLastError());
  };
  for_each_launch(table, list.numels, list.count, set_slot, launch);
}

}  // namespace

void launch_adamw_int8_multi_tensor(AdamwStorage storage, const AdamwTensorList& list, const AdamwParams& params,
                                    CUstream_st* stream) {
  launch_update("launch_adamw_int8_multi_tensor", "vlatune::adamw_int8", storage, list, params, /*int8_state=*/true,
                [&](auto st, const AdamwScalars& s) { launch_int8_typed<decltype(st)::value>(list, s, stream); });
}

}  // namespace vlatune::kernels
