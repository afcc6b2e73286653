// Torch entry points of the fused decoder ops (design note: fused.md). One op, its files: `<op>.h` (torch-free
// params and the raw-pointer launchers), `<op>.cu` (kernels and their tile choices), `<op>_ref.cpp` (the ATen
// reference), `<op>_autograd.cpp` (checks, dispatch by device, the autograd node); this header declares the
// entry points of every op, grouped by op.
//
// Each op is an autograd function: on CUDA with fp32/bf16 activations of a supported shape, forward and backward run
// the kernels; otherwise (CPU, fp64, odd shapes) they run the `_ref` forward and its analytic backward (the same
// formulas, in ATen ops), so the CPU tests exercise every autograd wrapper. The `*_ref` functions are the plain ATen
// sequences of the model's reference path (differentiable by autograd): the oracles of the tests and the "unfused"
// side of the benchmarks.
//
// Saved for backward (beyond parameters and the shared RoPE tables):
//   rms_norm_residual   h (or x without a residual) + rstd [rows] fp32
//   adarms_norm_residual x and delta (h is recomputed) + rstd [rows] fp32; x is the layer input that the
//                       pre-attention norm saves anyway, so the fused residual adds only delta
//   rope_qkv            nothing
//   merged_linear       x (as any Linear); the stacked weight is a view of the packed members (packed_rows) or,
//                       for unpacked members, a concatenation rebuilt in backward, never kept
//   geglu_linear        the merged gate+up output; the GeGLU output (the down projection's input) is rebuilt by
//                       the backward kernel (in the buffer of its gradient), not by a second forward kernel.
//                       With a MergedRebuild: not even the merged output (the gate+up GEMM runs again in backward)
//   layer_norm_residual h (or x without a residual) + mean and rstd [rows] fp32
//   gelu_linear         the fc1 output (pre-activation) only; the GELU output is rebuilt by the backward kernel
//   split_qkv_heads     nothing (its outputs are views of the merged QKV output; the backward stacks the three
//                       gradients into one [.., 3 * width] tensor instead of three zero-filled slice gradients)
//   gather_rows         the row list only
//   spread_rows         the row list only
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <vector>

namespace vlatune::kernels {

// True when this process runs the CUDA kernels for tensors like `x` (CUDA build, CUDA tensor, fp32 or bf16).
bool fused_kernels_apply(const at::Tensor& x);

// Which implementation an op runs (the model's blocks pass the one their forward resolved):
// - kFused: the autograd node (the kernels where fused_kernels_apply and the shape allows, else the reference
//   forward and its analytic backward);
// - kReference: the `_ref` ATen sequence, differentiated by autograd (the unfused model).
enum class OpPath { kFused, kReference };

struct NormOutputs {
  // The residual stream after the fused add. Without a residual: x itself (adarms_norm_residual) or, for
  // rms_norm_residual and layer_norm_residual, a view of x whose gradient the norm's backward kernel adds to x's
  // (read the residual stream through it: the engine then runs no separate gradient accumulation for x).
  at::Tensor h;
  at::Tensor y;  // the norm output
};

// ---------------------------------------------------------------------------------------------- rms_norm
// Gemma RMSNorm with the residual add fused: h = x + delta (delta may be undefined: h = x),
// y = h * rsqrt(mean(h^2) + eps) * (1 + weight), statistics in fp32 (fp64 for fp64 activations).
// x, delta [..., width] in the compute dtype; weight [width] in any floating dtype.
NormOutputs rms_norm_residual(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight, double eps,
                              OpPath path = OpPath::kFused);
NormOutputs rms_norm_residual_ref(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight, double eps);

// ---------------------------------------------------------------------------------------------- adarms_norm
// adaRMS with the gated residual fused: h = x + gate * delta (delta undefined: h = x, gate unused),
// y = h * rsqrt(mean(h^2) + eps) * (1 + scale) + shift. x, delta [B, T, width]; gate, scale, shift [B, 1, width]
// (views of the [B, 3 * width] modulations are fine: last dim contiguous), all in the compute dtype.
NormOutputs adarms_norm_residual(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& gate,
                                 const at::Tensor& scale, const at::Tensor& shift, double eps,
                                 OpPath path = OpPath::kFused);
NormOutputs adarms_norm_residual_ref(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& gate,
                                     const at::Tensor& scale, const at::Tensor& shift, double eps);

// The RMSNorm and adaRMS references with the per-row statistic their analytic backwards need (the autograd nodes'
// CPU forward): rstd [..., 1] in the math dtype.
struct RmsRef {
  at::Tensor h, y, rstd;
};
RmsRef rms_norm_ref_stats(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight, double eps);
RmsRef adarms_norm_ref_stats(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& gate,
                             const at::Tensor& scale, const at::Tensor& shift, double eps);
// Their analytic backward (the nodes' CPU path), for y = n * (1 + scale) (+ shift), n = h * rstd: the gradient of h,
// dh = rstd * (g - n * mean(g * n)) + grad_h with g = grad_y * (1 + scale), in the math dtype, and n and grad_y in
// the math dtype for the parameter gradients. rstd [rows] as saved; scale broadcast against h (the weight [W], or
// adaRMS's [B, 1, W]); grad_h may be undefined.
struct RmsBackwardRef {
  at::Tensor dh, n, gy;
};
RmsBackwardRef rms_norm_backward_ref(const at::Tensor& h, const at::Tensor& rstd, const at::Tensor& grad_y,
                                     const at::Tensor& grad_h, const at::Tensor& scale);

// ---------------------------------------------------------------------------------------------- layer_norm
// LayerNorm with the residual add fused (SigLIP): h = x + delta (delta undefined: h = x),
// y = layer_norm(h) * weight + bias with mean/variance in fp32 (fp64 for fp64). weight and bias [width] are cast
// to x's dtype first, as the reference does, so bf16 results equal the reference's up to the rounding order.
NormOutputs layer_norm_residual(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight,
                                const at::Tensor& bias, double eps, OpPath path = OpPath::kFused);
NormOutputs layer_norm_residual_ref(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight,
                                    const at::Tensor& bias, double eps);

// ---------------------------------------------------------------------------------------------- rope_qkv
struct QkvHeads {
  at::Tensor q;  // [B, H, Tq, D]: Tq = P + S, or S without prefix_q
  at::Tensor k;  // [B, Hk, P + S, D]
  at::Tensor v;  // [B, Hk, P + S, D]
};
// rope_qkv's CUDA kernel writes q, k and v token-major: the [B, h, T, D] tensors are transposed views of
// contiguous [B, T, h, D] buffers (q.transpose(1, 2) is contiguous), the layout the varlen attention reads
// (varlen_attention.h) and the one SDPA's output then takes; its backward reads gradients in either layout.

// The merged QKV outputs of the two branches -> attention inputs: prefix rows first, heads split, half-split RoPE
// on q and k in fp32 (fp64 for fp64), cast back. qkv_prefix [B, P, ((prefix_q ? H : 0) + 2 Hk) * D] ([q | k | v]
// columns, as merged_linear of {q_proj, k_proj, v_proj} or {k_proj, v_proj}); qkv_suffix [B, S, (H + 2 Hk) * D];
// cos, sin [B, 1, P + S, D / 2] in the math dtype (model::rope_tables).
QkvHeads rope_qkv(const at::Tensor& qkv_prefix, const at::Tensor& qkv_suffix, const at::Tensor& cos,
                  const at::Tensor& sin, int64_t heads, int64_t kv_heads, bool prefix_q);
QkvHeads rope_qkv_ref(const at::Tensor& qkv_prefix, const at::Tensor& qkv_suffix, const at::Tensor& cos,
                      const at::Tensor& sin, int64_t heads, int64_t kv_heads, bool prefix_q);
// The half-split rotation of x [B, H, T, D] by tables [B, 1, T, D / 2], in the tables' dtype, cast back to x's:
// [u cos - v sin | v cos + u sin] (u, v the halves of the last dim). With -sin: its transpose (the backward).
at::Tensor apply_rope_ref(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// ---------------------------------------------------------------------------------------------- split_qkv_heads
// The merged QKV output [B, T, 3 * heads * D] ([q | k | v] columns) -> q, k, v [B, heads, T, D] as views (no
// copy: SDPA reads the strided heads in place). Differentiable: the backward writes the three head gradients into
// one [B, T, 3 * heads * D] tensor with a single stack.
QkvHeads split_qkv_heads(const at::Tensor& qkv, int64_t heads);

// ---------------------------------------------------------------------------------------------- gather_rows,
// spread_rows A subset of rows and back (live_rows.h). rows: int64 [R], distinct rows of the flattened [n, w] tensor;
// slots: int64 [n], row i's place in `rows` (rows[slots[i]] == i), R or more for a row not listed
// (model::live_prefix_rows builds both). No atomics, no sums: each is the other's backward. gather_rows: x [.., w] (n
// rows) -> [R, w], x's rows in `rows` order (index_select).
at::Tensor gather_rows(const at::Tensor& x, const at::Tensor& rows, const at::Tensor& slots);
// spread_rows: y [R, w] -> `sizes` (n rows of w), row i = y[slots[i]] where listed, else zero. One copy kernel on
// CUDA (16-byte rows and alignment), else zeros and index_copy_.
at::Tensor spread_rows(const at::Tensor& y, const at::Tensor& rows, const at::Tensor& slots,
                       std::vector<int64_t> sizes);

// ---------------------------------------------------------------------------------------------- bias_grad
// A Linear's bias gradient from its output gradient g [..., N]: the sum of g over its rows, [N] in `dtype` (fp32
// accumulation). CUDA bf16/fp32 with N a multiple of 16 bytes: launch_bias_grad (two kernels); elsewhere ATen's sum
// and a cast.
at::Tensor bias_grad(const at::Tensor& g, at::ScalarType dtype);

// ---------------------------------------------------------------------------------------------- linear
// y = x W^T (+ b), at::linear, except a CUDA bf16/fp16 Linear with a bias: one autograd node with ATen's GEMMs whose
// backward sums the bias gradient with bias_grad instead of ATen's column reduction. Weight and bias in x's dtype.
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);

// ---------------------------------------------------------------------------------------------- merged_linear
// One GEMM for several Linears that read the same input: x W^T with W = [W_0; W_1; ...] (rows stacked, so the
// output's columns are [y_0 | y_1 | ...]), biases likewise (empty = no biases, else one per weight). Weights are
// cast to x's dtype when they differ. The parameters stay separate tensors (their names, state dicts and
// gradients are unchanged). Packed members (adjacent row slices of one buffer, model::pack_rows) are read as one
// view of that buffer (packed_rows: no copy); otherwise the stack is an at::cat, a temporary of the forward and of
// the backward, never saved. Backward: one dgrad GEMM; one weight-gradient GEMM for all members (each member's
// gradient a row view of its output; a GEMM per member when not every member needs one); the bias gradients from
// one bias_grad over the whole gradient.
at::Tensor merged_linear(const at::Tensor& x, const std::vector<at::Tensor>& weights,
                         const std::vector<at::Tensor>& biases = {});

// One view [sum N_i, ...] spanning `parts` when they are adjacent slices of one storage along dim 0, in order
// (each contiguous, same dtype, device and trailing sizes; part i + 1 starting where part i ends); else undefined
// (the caller concatenates). A single part is returned as is.
at::Tensor packed_rows(at::TensorList parts);

// How to rebuild a merged GEMM's output in backward instead of keeping it (the recompute unit
// `...mlp.gate_proj+up_proj`): `saved` are the tensors the rebuild reads (what the GEMM's own autograd node keeps
// anyway: its input, or its FP8 copy, and the weights, detached), `fn(saved)` returns the GEMM output bit-identical
// to the forward's (the same GEMM on the same inputs). fn must capture no tensors (they would outlive backward).
struct MergedRebuild {
  std::vector<at::Tensor> saved;
  std::function<at::Tensor(const std::vector<at::Tensor>& saved)> fn;
};

// The rebuild of merged_linear(x, weights) (no biases): saves x and the weights (no extra memory: merged_linear's
// node keeps the same tensors), fn runs merged_linear again without autograd.
MergedRebuild merged_linear_rebuild(const at::Tensor& x, const std::vector<at::Tensor>& weights);

// ---------------------------------------------------------------------------------------------- geglu
// GeGLU on the merged gate+up output: gelu_tanh(merged[..., :F]) * merged[..., F:] (no autograd of its own:
// geglu_linear is the differentiable form; this one is for tests and benchmarks). Dispatches like the others.
at::Tensor geglu(const at::Tensor& merged);
at::Tensor geglu_ref(const at::Tensor& merged);
// The gradient of `merged` given the gradient of geglu(merged) (kernel on CUDA, the analytic reference elsewhere).
at::Tensor geglu_backward(const at::Tensor& grad, const at::Tensor& merged);
at::Tensor geglu_backward_ref(const at::Tensor& grad, const at::Tensor& merged);

// down(geglu(merged)) = geglu(merged) W^T (+ b), as one autograd node that saves `merged` and recomputes the GeGLU
// output in backward (it is the largest activation of the layer: Pi0.5's prefix MLP is 16,384 wide). `scope_fqn`
// names the profiler scope of the down-projection GEMM (the GeGLU stays in the caller's scope); empty = none.
// With `rebuild` (not null), `merged` is not saved: the node keeps rebuild->saved and calls rebuild->fn at the start
// of its backward (one more forward GEMM, 2 bytes x rows x 2F less held from forward to backward).
at::Tensor geglu_linear(const at::Tensor& merged, const at::Tensor& weight, const at::Tensor& bias,
                        const std::string& scope_fqn, const MergedRebuild* rebuild = nullptr);

// ---------------------------------------------------------------------------------------------- gelu
// fc2(gelu_tanh(pre)) = gelu_tanh(pre) W^T (+ b) as one autograd node that saves `pre` only (SigLIP's MLP: the
// GELU output, 4,304 wide, is rebuilt by the backward kernel). `scope_fqn` names the GEMM's profiler scope.
at::Tensor gelu_linear(const at::Tensor& pre, const at::Tensor& weight, const at::Tensor& bias,
                       const std::string& scope_fqn);
// gelu_tanh alone (kernel on CUDA, ATen elsewhere; no autograd of its own): for tests and benchmarks.
at::Tensor gelu(const at::Tensor& x);
at::Tensor gelu_ref(const at::Tensor& x);
// The gradient of x given the gradient of gelu(x). rebuild_act (CUDA kernel only; grad dense): gelu(x) is written
// over `grad` by the same kernel (what gelu_linear's backward does for fc2's weight gradient).
at::Tensor gelu_backward(at::Tensor& grad, const at::Tensor& x, bool rebuild_act = false);
// The gradient of x and gelu(x) again, for a backward that needs both (fc2's input gradient and weight gradient):
// one kernel pass writing gelu(x) over `grad` where the kernel runs on a dense `grad`, else gelu_backward and gelu
// apart. `act` holds the forward kernel's values bit for bit either way.
struct GeluGrads {
  at::Tensor grad_x, act;
};
GeluGrads gelu_backward_rebuild(at::Tensor& grad, const at::Tensor& x);

}  // namespace vlatune::kernels
