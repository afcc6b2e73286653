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

// geglu_value and geglu_grads for two elements (.x and .y), the roundings to T paired (round_to2): the same values,
// for the issue-bound fused FP8 casts. Their byte-equality tests against the geglu kernels cover both forms.
template <typename T>
__device__ __forceinline__ float2 geglu_value2(float2 gate, float2 up) {
  const float2 gelu = round_to2<T>(make_float2(gelu_tanh(gate.x), gelu_tanh(gate.y)));
  return make_float2(gelu.x * up.x, gelu.y * up.y);
}

struct GegluGrads2 {
  float2 d_gate, d_up, act;
};

template <typename T>
__device__ __forceinline__ GegluGrads2 geglu_grads2(float2 gate, float2 up, float2 d) {
  const GeluTanhPair px = gelu_tanh_pair(gate.x), py = gelu_tanh_pair(gate.y);
  const float2 gelu = round_to2<T>(make_float2(px.value, py.value));
  const float2 d_up_rounded = round_to2<T>(make_float2(d.x * up.x, d.y * up.y));
  return {make_float2(d_up_rounded.x * px.slope, d_up_rounded.y * py.slope), make_float2(d.x * gelu.x, d.y * gelu.y),
          make_float2(gelu.x * up.x, gelu.y * up.y)};
}

}  // namespace vlatune::kernels::fused_detail
