// What the kernel A/B harnesses (fp8_cast_ab.cu, layer_norm_ab.cu) share: CUDA error checks, zeroed device buffers
// and deterministic pseudo-random fills. Dev tools only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace harness {

// x[i] = offset + (hash(i, seed) in [-0.5, 0.5]) * amplitude, as bf16 or fp32.
__global__ void fill_kernel(void* x, int64_t n, bool bf16, uint32_t seed, float offset, float amplitude) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    const float v = offset + ((h & 0xffff) / 65535.f - 0.5f) * amplitude;
    if (bf16)
      static_cast<__nv_bfloat16*>(x)[i] = __float2bfloat16(v);
    else
      static_cast<float*>(x)[i] = v;
  }
}

inline void check_cuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
  std::exit(2);
}

inline void* device_zeros(int64_t bytes) {
  void* p = nullptr;
  check_cuda(cudaMalloc(&p, bytes), "cudaMalloc");
  check_cuda(cudaMemset(p, 0, bytes), "cudaMemset");
  return p;
}

inline void fill(void* x, int64_t n, bool bf16, uint32_t seed, float offset, float amplitude) {
  const unsigned blocks = n >= 65536 ? 4096 : 64;
  fill_kernel<<<blocks, 256>>>(x, n, bf16, seed, offset, amplitude);
}

}  // namespace harness
