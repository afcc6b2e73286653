// Q/K/V split of the merged QKV GEMM outputs of both branches, prefix+suffix concatenation and half-split RoPE
// of q and k, in one pass; the backward is the inverse rotation and the inverse scatter (rope_qkv.h, fused.md).
// Torch-free: raw pointers, a stream, VLATUNE_CUDA_CHECK.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "kernels/cuda_check.h"
#include "kernels/fused_device.cuh"
#include "kernels/rope_qkv.h"

namespace vlatune::kernels {

using namespace fused_detail;

namespace {

// Tile choices: one block per (batch, position): the position's row of heads is read once and written to the
// attention inputs, token-major ([B, T, heads, D]: a position's heads are adjacent, as the varlen attention reads
// them). 128 threads: Pi0.5 (8 q + 1 k heads of 256: 16 rotation items each, + 32 copy items of v) has 176 items per
// position, so two passes of the block cover them; the tiny config 7.
constexpr int kThreads = 128;

int64_t rope_qkv_blocks(const RopeQkvParams& p) {
  return p.batch * (p.prefix_len + p.suffix_len);
}

template <bool kForward, typename T>
__global__ void __launch_bounds__(kThreads) rope_qkv_kernel(const RopeQkvParams p) {
  constexpr int V = kVec<T>;
  const int64_t n_total = p.prefix_len + p.suffix_len;
  const int64_t b = blockIdx.x / n_total, n = blockIdx.x % n_total;
  const bool prefix = n < p.prefix_len;
  const bool has_q = !prefix || p.prefix_q;
  const int q_heads = has_q ? p.heads : 0;
  const int D = p.head_dim, half = D / 2;
  const int row_heads = q_heads + 2 * p.kv_heads;
  T* src = prefix ? static_cast<T*>(p.qkv_prefix) + (b * p.prefix_len + n) * row_heads * D
                  : static_cast<T*>(p.qkv_suffix) + (b * p.suffix_len + (n - p.prefix_len)) * row_heads * D;
  const int64_t tq_len = p.prefix_q ? n_total : p.suffix_len;
  const int64_t tq = p.prefix_q ? n : n - p.prefix_len;
  const float* cs = p.cos + (b * n_total + n) * half;
  const float* sn = p.sin + (b * n_total + n) * half;

  const int rot_items = half / V;  // vector pairs per rotated head
  const int rot_total = (q_heads + p.kv_heads) * rot_items;
  const int copy_items = D / V;  // vectors per v head
  const int total = rot_total + p.kv_heads * copy_items;
  for (int item = threadIdx.x; item < total; item += blockDim.x) {
    if (item < rot_total) {
      const int head = item / rot_items;     // 0..q_heads-1: q; then k
      const int i = (item % rot_items) * V;  // first element of the pair's u half
      const bool is_q = head < q_heads;
      const int h = is_q ? head : head - q_heads;
      T* dst = is_q ? static_cast<T*>(p.q) + ((b * tq_len + tq) * p.heads + h) * D
                    : static_cast<T*>(p.k) + ((b * n_total + n) * p.kv_heads + h) * D;
      T* s = src + static_cast<int64_t>(head) * D;  // q heads first, then k heads, in the merged row
      const T* in = kForward ? s : dst;
      T* out = kForward ? dst : s;
      const Pack<T, V> u = load_pack(in + i, 0);
      const Pack<T, V> w = load_pack(in + half + i, 0);
      Pack<T, V> ou, ow;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float c = cs[i + k], sv = sn[i + k];
        const float uf = to_float(u.v[k]), wf = to_float(w.v[k]);
        if (kForward) {  // u*cos - v*sin, v*cos + u*sin: no FMA contraction, as ATen's separate kernels
          ou.v[k] = from_float<T>(__fsub_rn(__fmul_rn(uf, c), __fmul_rn(wf, sv)));
          ow.v[k] = from_float<T>(__fadd_rn(__fmul_rn(wf, c), __fmul_rn(uf, sv)));
        } else {  // the transpose of the rotation: gu*cos + gv*sin, gv*cos - gu*sin
          ou.v[k] = from_float<T>(__fadd_rn(__fmul_rn(uf, c), __fmul_rn(wf, sv)));
          ow.v[k] = from_float<T>(__fsub_rn(__fmul_rn(wf, c), __fmul_rn(uf, sv)));
        }
      }
      store_pack(out + i, 0, ou);
      store_pack(out + half + i, 0, ow);
    } else {
      const int rest = item - rot_total;
      const int h = rest / copy_items;
      const int i = (rest % copy_items) * V;
      T* dst = static_cast<T*>(p.v) + ((b * n_total + n) * p.kv_heads + h) * D;
      T* s = src + static_cast<int64_t>(q_heads + p.kv_heads + h) * D;
      if (kForward) {
        store_pack(dst + i, 0, load_pack(s + i, 0));
      } else {
        store_pack(s + i, 0, load_pack(dst + i, 0));
      }
    }
  }
}

template <bool kForward>
void launch(const RopeQkvParams& p, cudaStream_t stream, const char* op) {
  if (!rope_qkv_supported(p.dtype, p.head_dim))
    throw std::invalid_argument(std::string(op) + ": unsupported head_dim " + std::to_string(p.head_dim) +
                                " (head_dim / 2 must be a multiple of 16 bytes)");
  const int64_t blocks = rope_qkv_blocks(p);
  if (blocks == 0) return;
  NvtxRange range(op);
  if (p.dtype == ActDtype::kBf16) {
    rope_qkv_kernel<kForward, __nv_bfloat16><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p);
  } else {
    rope_qkv_kernel<kForward, float><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p);
  }
  VLATUNE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

bool rope_qkv_supported(ActDtype dtype, int head_dim) {
  const int vec = dtype == ActDtype::kBf16 ? 8 : 4;
  return head_dim > 0 && head_dim % 2 == 0 && (head_dim / 2) % vec == 0;
}

void launch_rope_qkv_fwd(const RopeQkvParams& p, CUstream_st* stream) {
  launch<true>(p, stream, "vlatune::rope_qkv_fwd");
}

void launch_rope_qkv_bwd(const RopeQkvParams& p, CUstream_st* stream) {
  launch<false>(p, stream, "vlatune::rope_qkv_bwd");
}

}  // namespace vlatune::kernels
