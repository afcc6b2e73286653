// SigLIP's tanh GELU: forward and backward (math in gelu.h, design in fused.md).
// Torch-free: raw pointers, a stream, VLATUNE_CUDA_CHECK.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/cuda_check.h"
#include "kernels/fused_device.cuh"
#include "kernels/gelu.h"

namespace vlatune::kernels {

using namespace fused_detail;

namespace {

// Tile choices: a grid-stride loop over 16-byte vectors (fused_detail::stream_blocks).
constexpr int kThreads = kStreamThreads;

template <typename T>
__global__ void __launch_bounds__(kThreads) gelu_fwd_kernel(const GeluParams p) {
  constexpr int V = kVec<T>;
  const int64_t total = p.numel / V;
  const T* x = static_cast<const T*>(p.x);
  T* out = static_cast<T*>(p.out);
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const Pack<T, V> xp = load_pack(x, idx);
    Pack<T, V> o;
#pragma unroll
    for (int k = 0; k < V; ++k) o.v[k] = from_float<T>(gelu_tanh(to_float(xp.v[k])));
    store_pack(out, idx, o);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) gelu_bwd_kernel(const GeluParams p) {
  constexpr int V = kVec<T>;
  const int64_t total = p.numel / V;
  const T* x = static_cast<const T*>(p.x);
  const T* grad = static_cast<const T*>(p.grad_out);
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const Pack<T, V> xp = load_pack(x, idx);
    const Pack<T, V> dy = load_pack(grad, idx);
    Pack<T, V> dx, act;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float v = to_float(xp.v[k]);
      const GeluTanhPair pair = gelu_tanh_pair(v);
      dx.v[k] = from_float<T>(to_float(dy.v[k]) * pair.slope);
      act.v[k] = from_float<T>(pair.value);
    }
    store_pack(static_cast<T*>(p.out), idx, dx);
    if (p.act_out != nullptr) store_pack(static_cast<T*>(p.act_out), idx, act);  // may alias grad_out
  }
}

void launch_gelu(const GeluParams& p, bool forward, cudaStream_t stream) {
  const char* op = forward ? "vlatune::gelu_fwd" : "vlatune::gelu_bwd";
  if (!gelu_supported(p.dtype, p.numel))
    throw std::invalid_argument(std::string(op) + ": unsupported element count " + std::to_string(p.numel) +
                                " (a multiple of 16 bytes)");
  if (p.numel == 0) return;
  NvtxRange range(op);
  if (p.dtype == ActDtype::kBf16) {
    const auto blocks = static_cast<unsigned>(stream_blocks(p.numel / kVec<__nv_bfloat16>));
    if (forward) {
      gelu_fwd_kernel<__nv_bfloat16><<<blocks, kThreads, 0, stream>>>(p);
    } else {
      gelu_bwd_kernel<__nv_bfloat16><<<blocks, kThreads, 0, stream>>>(p);
    }
  } else {
    const auto blocks = static_cast<unsigned>(stream_blocks(p.numel / kVec<float>));
    if (forward) {
      gelu_fwd_kernel<float><<<blocks, kThreads, 0, stream>>>(p);
    } else {
      gelu_bwd_kernel<float><<<blocks, kThreads, 0, stream>>>(p);
    }
  }
  VLATUNE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

bool gelu_supported(ActDtype dtype, int64_t numel) {
  const int vec = dtype == ActDtype::kBf16 ? 8 : 4;
  return numel >= 0 && numel % vec == 0;
}

void launch_gelu_fwd(const GeluParams& p, CUstream_st* stream) {
  launch_gelu(p, true, stream);
}

void launch_gelu_bwd(const GeluParams& p, CUstream_st* stream) {
  launch_gelu(p, false, stream);
}

}  // namespace vlatune::kernels
