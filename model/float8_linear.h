// FP8 Linear (design note kernels/fp8.md): y = x W^T through three FP8 GEMMs (at::_scaled_mm), tensorwise
// scales, e4m3 for activations and weights, e5m2 for the output gradient, output in x's dtype (bf16).
//
//   forward   x -> x_q (row-major, for y) + x_q^T (saved, for dW) in one pass; W -> W_q (row-major);
//             y = x_q W_q^T (fast accumulation)
//   backward  dy -> dy_q + dy_q^T in one pass; W -> W_q^T (the forward's weight scale, no amax pass);
//             dx = dy_q W_q (row-major A = dy_q, column-major B = (W_q^T)^T); dW_i = (dy_q^T)[rows of member i] x_q
//
// Saved for backward: x_q^T (one byte per element instead of x's two) and its scale, the weights (parameters) and
// the weight amax. Weights are quantized once per pass (forward: row-major, backward: transposed) rather than
// cached for the step: a cache would keep 2 bytes per FP8 parameter (~4.6 GB for Pi0.5's decoders) alive all step.
// Activations and gradients: current scaling (amax pass + cast pass) or delayed scaling (one pass: the scale comes
// from the amax history of the previous casts of that tensor, the cast records this amax; the first cast is
// current). Weights always use current scaling (once per pass, cheap against the GEMMs).
// Rows (tokens) that are not a multiple of 16 are zero-padded (exact); in/out features must be multiples of 16.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "kernels/fp8_ops.h"
#include "kernels/fused_ops.h"

namespace vlatune::model {

enum class Fp8Scaling { kCurrent, kDelayed };

struct Fp8Config {
  Fp8Scaling scaling = Fp8Scaling::kDelayed;
  int64_t amax_history = 16;  // delayed: entries of the history (the previous 15 casts + the one being written)
  // The GeGLU kernels cast straight to FP8 (kernels/fp8_ops.h fp8_geglu_*): down_proj's input in the forward, and in
  // the backward d merged for the gate+up GEMM plus down_proj's rebuilt input, with no bf16 copy in between. The
  // bytes equal the unfused sequence's (tested); off: that sequence.
  bool fused_geglu_casts = true;
  // The same for SigLIP's GELU backward between two FP8 Linears (float8_gelu_linear's `producer`): fc1's output
  // gradient cast to FP8 and fc2's input rebuilt in one pass. The casts' bytes equal the unfused sequence's (tested);
  // fc1's bias gradient sums the same values in another order. Off: that sequence.
  bool fused_gelu_casts = true;
  // A GeGLU down projection keeps its input (the gate+up output) for the backward in e4m3 blocks
  // (kernels::GegluBlocks: half the bytes; recipe fp8.saved_geglu_inputs "e4m3-blocks") instead of bf16, where F
  // is a multiple of 64 and the rows of 16 (else bf16). Its GeGLU gradient reads the dequantized values.
  bool saved_geglu_blocks = false;
  // The cuBLASLt algorithm of every FP8 GEMM (recipe fp8.gemm_algorithm; kernels::fp8_mm).
  kernels::Fp8GemmAlgorithm gemm_algorithm = kernels::Fp8GemmAlgorithm::kHeuristic;
};

// Amax history of one quantized tensor role (delayed scaling), on the device of the tensors it scales.
struct Fp8AmaxHistory {
  torch::Tensor amax;  // [amax_history] fp32, zeros until used
  int64_t uses = 0;
};

// An output gradient already cast to FP8 (e5m2) by the consumer's backward: row-major, transposed, 1 / scale, and
// (from the GELU backward) its column sums, the producer's bias gradient.
struct Fp8Gradient {
  torch::Tensor data, data_t, inv_scale;
  torch::Tensor bias_grad;  // [N] or undefined
};

// The state of one FP8 GEMM: a Linear, or a merged GEMM (QKV, gate+up; the state of its first FP8 member).
struct Float8State {
  Fp8Config config;
  Fp8AmaxHistory input, grad_output;
  // Left by the FP8 GeGLU (GELU) backward for the GEMM that produced its input, the gate+up GEMM (SigLIP's fc1), cast
  // with this state's grad_output scaling; that GEMM's backward takes it instead of casting the placeholder gradient
  // autograd hands it.
  std::optional<Fp8Gradient> pending_grad;
  int64_t pending_grads_taken = 0;  // backward passes that used one (a count for tests and logs)
};

// x [..., K] -> [..., sum N_i]: one GEMM against the row-stacked weights (merged GEMM) or a single Linear; bias
// (optional, [sum N_i]: the members' biases concatenated) added in the GEMM's epilogue (kernels::fp8_mm), its
// gradient summed by kernels::bias_grad. Throws std::invalid_argument when K or an N_i is not a multiple of 16.
// `rebuild` (no bias): filled with how to compute the output again in backward (the recompute unit
// `...mlp.gate_proj+up_proj`): it reads the node's own saved x_q^T (transposed back to row-major at rebuild time:
// no byte more held), the scales and the weights, and runs the same FP8 GEMM, so the rebuilt output is
// bit-identical to this one.
torch::Tensor float8_linear(const torch::Tensor& x, const std::vector<torch::Tensor>& weights,
                            const torch::Tensor& bias, Float8State& state, kernels::MergedRebuild* rebuild = nullptr);

// down(geglu(merged)) with the down projection in FP8 (kernels::geglu_linear's FP8 form): saves `merged` and recomputes
// the GeGLU output in backward, re-quantized transposed with the forward's scale. scope_fqn: the GEMM's profiler scope.
// With `rebuild`: keeps rebuild->saved instead of `merged` and rebuilds it at the start of the backward.
// With `producer` (the FP8 state of the merged gate+up GEMM that computed `merged` through float8_linear) and
// config.fused_geglu_casts, the backward casts d merged straight to FP8 for that GEMM (Float8State::pending_grad)
// in the same pass that rebuilds this GEMM's input; the GeGLU output is cast by the GeGLU kernel in the forward too.
torch::Tensor float8_geglu_linear(const torch::Tensor& merged, const torch::Tensor& weight, Float8State& state,
                                  const std::string& scope_fqn, const kernels::MergedRebuild* rebuild = nullptr,
                                  Float8State* producer = nullptr);

// fc2(gelu_tanh(pre)) with fc2 in FP8 (kernels::gelu_linear's FP8 form, SigLIP's MLP): gelu_tanh(pre) cast to e4m3
// for the GEMM as it is computed (kernels::fp8_gelu_quantize_into), bias (optional, [out]) in its epilogue. Saves `pre`
// only, as the bf16 node does; the backward rebuilds the GELU output (kernels::gelu_backward_rebuild) and casts it
// transposed with the forward's scale for the weight gradient. scope_fqn: the cast's and GEMM's profiler scope. Throws
// std::invalid_argument for a weight that is not [out, F] with F and out multiples of 16, or a bias that is not [out].
// With `producer` (the FP8 state of the Linear whose output `pre` is, through float8_linear, with nothing else
// reading pre's gradient) and config.fused_gelu_casts, the backward computes the GELU gradient, casts it to e5m2 for
// that Linear (Float8State::pending_grad, with its column sums as the bias gradient) and casts the rebuilt GELU
// output, in one pass (kernels::fp8_gelu_backward_quantize_into): no bf16 gradient or activation in memory.
torch::Tensor float8_gelu_linear(const torch::Tensor& pre, const torch::Tensor& weight, const torch::Tensor& bias,
                                 Float8State& state, const std::string& scope_fqn, Float8State* producer = nullptr);

// Checks a Linear's shape for FP8: empty when fine, else the reason ("in_features 100 is not a multiple of 16").
std::string float8_shape_problem(int64_t in_features, int64_t out_features);

}  // namespace vlatune::model
