// The arithmetic of the 8-bit AdamW update, written once for the CPU reference (adamw_ref.cpp) and the CUDA
// kernel (adamw_int8.cu), so that both compute the same bits: every operation is one IEEE fp32 operation rounded
// to nearest (on the device through the __f*_rn intrinsics, which the compiler never contracts into FMAs; on the
// host the project compiles ISO C++ without -march, where GCC neither contracts nor has FMA instructions).
// Torch-free and CUDA-free when included by a .cpp file. Design note: adamw.md ("8-bit state").
#pragma once

#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#define VLATUNE_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define VLATUNE_HOST_DEVICE inline
#endif

namespace vlatune::kernels::int8_math {

VLATUNE_HOST_DEVICE float mul(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
VLATUNE_HOST_DEVICE float add(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
VLATUNE_HOST_DEVICE float sub(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
VLATUNE_HOST_DEVICE float div(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
VLATUNE_HOST_DEVICE float sqrt_rn(float a) {
#ifdef __CUDA_ARCH__
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}

// fp32 scalars of one update (AdamwParams rounded once; adamw.h).
struct UpdateScalars {
  float beta1, one_minus_beta1, beta2, one_minus_beta2, eps;
  float decay;      // 1 - lr * weight_decay
  float step_size;  // lr / (1 - beta1^step)
  float bc2_sqrt;   // sqrt(1 - beta2^step)
};

// One element, in torch.optim.AdamW's order of operations (as adamw.cu's full-precision kernel).
VLATUNE_HOST_DEVICE void adamw_element(float& p, float g, float& m, float& v, const UpdateScalars& s) {
  p = mul(p, s.decay);
  m = add(mul(s.beta1, m), mul(s.one_minus_beta1, g));
  v = add(mul(s.beta2, v), mul(mul(s.one_minus_beta2, g), g));
  const float denom = add(div(sqrt_rn(v), s.bc2_sqrt), s.eps);
  p = sub(p, mul(s.step_size, div(m, denom)));
}

// Code points: 256 sorted fp32 values in [-1, 1] (AdamwQuantMaps). midpoints[k] = (code[k] + code[k+1]) / 2 for
// k < 255 and midpoints[255] = +inf, so that the number of midpoints below x is the index of the nearest code
// point (ties go to the lower one).
VLATUNE_HOST_DEVICE float code_midpoint(const float* code, int k) {
  return k < 255 ? mul(add(code[k], code[k + 1]), 0.5f) : INFINITY;
}

// The index of the code point nearest to x: a branch-free binary search over the 256 midpoints (eight compares,
// the same on every thread). A NaN lands on index 0.
VLATUNE_HOST_DEVICE uint8_t quantize_index(const float* midpoints, float x) {
  int i = 0;
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
  for (int step = 128; step > 0; step >>= 1) {
    if (midpoints[i + step - 1] < x) i += step;
  }
  return static_cast<uint8_t>(i);
}

// 1 / absmax, and 0 for an all-zero block (whose values then all quantize to the code point 0).
VLATUNE_HOST_DEVICE float inverse_absmax(float absmax) {
  return absmax > 0.f ? div(1.f, absmax) : 0.f;
}

}  // namespace vlatune::kernels::int8_math
