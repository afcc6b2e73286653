// GeGLU's element math on the device, shared by geglu.cu's kernels and fp8_quant.cu's fused GeGLU casts so that
// their values agree bit for bit.
#pragma once

#include "kernels/fused_device.cuh"

namespace vlatune::kernels::fused_detail {

// One GeGLU output element, gelu(gate) * up, before its rounding to T: the activation rounded to T first, where
// the unfused sequence stores it.
template <typename T>
__device__ __forceinline__ float geglu_value(float gate, float up) {
  return round_to<T>(gelu_tanh(gate)) * up;
}

// The autograd of gelu(gate) * up for one element, each before its rounding to T: d_gate = gelu_backward(round(d *
// up), gate), d_up = d * round(gelu(gate)), and act the forward's output (geglu_value).

struct GegluGrads {
  float d_gate, d_up, act;
};

template <typename T>
__device__ __forceinline__ GegluGrads geglu_grads(float gate, float up, float d) {
  const GeluTanhPair pair = gelu_tanh_pair(gate);
  const float gelu = round_to<T>(pair.value);
  return {round_to<T>(d * up) * pair.slope, d * gelu, gelu * up};
}

}  // namespace vlatune::kernels::fused_detail
