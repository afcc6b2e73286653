// GeGLU on the merged gate+up GEMM output: forward and backward (math in geglu.h, design in fused.md).
// Torch-free: raw pointers, a stream, VLATUNE_CUDA_CHECK.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/cuda_check.h"
#include "kernels/fused_device.cuh"
#include "kernels/geglu.h"
#include "kernels/geglu_device.cuh"

namespace vlatune::kernels {

using namespace fused_detail;

namespace {

// ---- Tile choices ----
// A grid-stride loop over 16-byte vectors of the output (fused_detail::stream_blocks). The forward over power-of-two
// rows (2048 and 512 vectors for
// Pi0.5's backbone and expert) uses 32-bit index math with the row split by shift and mask instead of a 64-bit
// division per vector, kUnroll vectors per thread per iteration with every load issued before the math: on the
// H200 it takes 0.61 ms where the grid-stride kernel takes 0.65 (BM_fused_geglu); the same form of the backward
// was slower than the grid-stride one (1.25 vs 1.15 ms), and streaming cache hints slowed both (bench/RESULTS.md,
// 2026-12-01, GeGLU kernels).
constexpr int kThreads = kStreamThreads;
constexpr int kUnroll = 2;

struct RowSplit {
  uint32_t total = 0;  // vectors
  uint32_t shift = 0;  // log2(vectors per row)
};

struct GegluTiles {
  bool pow2 = false;  // the forward's power-of-two form
  RowSplit split;     // with pow2
  int64_t blocks = 0;
};

template <typename T>
GegluTiles geglu_tiles(const GegluParams& p, bool forward) {
  const int64_t per_row = p.features / kVec<T>;
  const int64_t total = p.rows * per_row;
  GegluTiles t;
  t.pow2 = forward && per_row > 0 && total < (int64_t{1} << 31) && (per_row & (per_row - 1)) == 0;
  if (t.pow2) {
    t.split.total = static_cast<uint32_t>(total);
    while ((int64_t{1} << t.split.shift) < per_row) ++t.split.shift;
  }
  t.blocks = stream_blocks(t.pow2 ? (total + kUnroll - 1) / kUnroll : total);
  return t;
}

// The grid-stride walk of the forward and backward kernels over the 16-byte vectors of the [rows, features] output:
// body(r, c, gate, up) for row r, column c, with the gate and up vectors of that element already loaded.
template <typename T, typename Body>
__device__ __forceinline__ void for_each_gate_up(const GegluParams& p, Body body) {
  constexpr int V = kVec<T>;
  const int64_t vec_per_row = p.features / V;
  const int64_t total = p.rows * vec_per_row;
  const T* merged = static_cast<const T*>(p.merged);
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = idx / vec_per_row, c = (idx % vec_per_row) * V;
    const T* row = merged + r * 2 * p.features;
    const Pack<T, V> g = load_pack(row + c, 0);
    const Pack<T, V> u = load_pack(row + p.features + c, 0);
    body(r, c, g, u);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) geglu_fwd_kernel(const GegluParams p) {
  constexpr int V = kVec<T>;
  T* out = static_cast<T*>(p.out);
  for_each_gate_up<T>(p, [&](int64_t r, int64_t c, const Pack<T, V>& g, const Pack<T, V>& u) {
    Pack<T, V> o;
#pragma unroll
    for (int k = 0; k < V; ++k) o.v[k] = from_float<T>(geglu_value<T>(to_float(g.v[k]), to_float(u.v[k])));
    store_pack(out + r * p.features + c, 0, o);
  });
}

template <typename T>
__global__ void __launch_bounds__(kThreads) geglu_bwd_kernel(const GegluParams p) {
  constexpr int V = kVec<T>;
  const T* grad = static_cast<const T*>(p.grad_out);
  T* out = static_cast<T*>(p.out);
  for_each_gate_up<T>(p, [&](int64_t r, int64_t c, const Pack<T, V>& g, const Pack<T, V>& u) {
    const Pack<T, V> dy = load_pack(grad + r * p.features + c, 0);
    Pack<T, V> dg, du, act;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const GegluGrads e = geglu_grads<T>(to_float(g.v[k]), to_float(u.v[k]), to_float(dy.v[k]));
      dg.v[k] = from_float<T>(e.d_gate);
      du.v[k] = from_float<T>(e.d_up);
      act.v[k] = from_float<T>(e.act);  // the forward's output, rounded as there
    }
    T* orow = out + r * 2 * p.features;
    store_pack(orow + c, 0, dg);
    store_pack(orow + p.features + c, 0, du);
    // After the loads of this element's gradient: act_out may be grad_out itself.
    if (p.act_out != nullptr) store_pack(static_cast<T*>(p.act_out) + r * p.features + c, 0, act);
  });
}

template <typename T>
__global__ void __launch_bounds__(kThreads) geglu_fwd_pow2_kernel(const GegluParams p, const RowSplit split) {
  constexpr int V = kVec<T>;
  const uint32_t mask = (1u << split.shift) - 1;
  const T* merged = static_cast<const T*>(p.merged);
  T* out = static_cast<T*>(p.out);
  const uint32_t stride = gridDim.x * kThreads * kUnroll;
  for (uint32_t base = blockIdx.x * kThreads * kUnroll + threadIdx.x; base < split.total; base += stride) {
    Pack<T, V> g[kUnroll], u[kUnroll];
    int64_t in_off[kUnroll], out_off[kUnroll];
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) {
      const uint32_t idx = base + j * kThreads;
      if (idx >= split.total) break;
      const int64_t r = idx >> split.shift, c = static_cast<int64_t>(idx & mask) * V;
      in_off[j] = r * 2 * p.features + c;
      out_off[j] = r * p.features + c;
      g[j] = load_pack(merged + in_off[j], 0);
      u[j] = load_pack(merged + in_off[j] + p.features, 0);
    }
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) {
      if (base + j * kThreads >= split.total) break;
      Pack<T, V> o;
#pragma unroll
      for (int k = 0; k < V; ++k) o.v[k] = from_float<T>(geglu_value<T>(to_float(g[j].v[k]), to_float(u[j].v[k])));
      store_pack(out + out_off[j], 0, o);
    }
  }
}

template <typename T>
void launch_typed(const GegluParams& p, bool forward, cudaStream_t stream) {
  const GegluTiles t = geglu_tiles<T>(p, forward);
  const auto blocks = static_cast<unsigned>(t.blocks);
  if (t.pow2) {
    geglu_fwd_pow2_kernel<T><<<blocks, kThreads, 0, stream>>>(p, t.split);
  } else if (forward) {
    geglu_fwd_kernel<T><<<blocks, kThreads, 0, stream>>>(p);
  } else {
    geglu_bwd_kernel<T><<<blocks, kThreads, 0, stream>>>(p);
  }
}

void launch(const GegluParams& p, bool forward, cudaStream_t stream) {
  const char* op = forward ? "vlatune::geglu_fwd" : "vlatune::geglu_bwd";
  if (!geglu_supported(p.dtype, p.features))
    throw std::invalid_argument(std::string(op) + ": unsupported feature count " + std::to_string(p.features) +
                                " (a multiple of 16 bytes)");
  if (p.rows == 0) return;
  NvtxRange range(op);
  if (p.dtype == ActDtype::kBf16) {
    launch_typed<__nv_bfloat16>(p, forward, stream);
  } else {
    launch_typed<float>(p, forward, stream);
  }
  VLATUNE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

bool geglu_supported(ActDtype dtype, int64_t features) {
  const int vec = dtype == ActDtype::kBf16 ? 8 : 4;
  return features > 0 && features % vec == 0;
}

void launch_geglu_fwd(const GegluParams& p, CUstream_st* stream) {
  launch(p, true, stream);
}

void launch_geglu_bwd(const GegluParams& p, CUstream_st* stream) {
  launch(p, false, stream);
}

}  // namespace vlatune::kernels
