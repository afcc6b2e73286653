// Fused decoder kernels (issue 8): torch-free params structs and raw-pointer launchers. Kernels in norm.cu
// (RMSNorm / adaRMS / LayerNorm with the residual fused), rope.cu (Q/K/V split + RoPE in one pass) and geglu.cu
// (GeGLU, GELU); the ATen references in fused_ref.cpp; checks, dispatch by device and the autograd wrappers in
// fused_autograd.cpp, declared in fused_ops.h. Design note: fused.md.
//
// Layout shared by all of them: activations are contiguous rows of `width` elements in the compute dtype (fp32
// or bf16); every statistic and every product is computed in fp32; results are rounded to the compute dtype
// once, where the unfused ATen sequence rounds (so the bf16 results match the reference's roundings).
#pragma once

#include <cstdint>

struct CUstream_st;  // cudaStream_t without <cuda_runtime.h>: this header is included by CPU-only builds

namespace vlatune::kernels {

enum class ActDtype { kFp32, kBf16 };

// ---------------------------------------------------------------------------------------------- RMSNorm
// h = x + delta (rounded to the dtype, as ATen's add; h = x when delta is null),
// y = h * rstd * (1 + weight), rstd = rsqrt(mean(h^2) + eps), all in fp32.
struct RmsNormFwdParams {
  ActDtype dtype = ActDtype::kBf16;
  int64_t rows = 0, width = 0;
  const void* x = nullptr;         // [rows, width]
  const void* delta = nullptr;     // [rows, width] or null
  const float* weight = nullptr;   // [width], fp32
  const void* weight_t = nullptr;  // or [width] in the activation dtype, read instead (no fp32 copy to make)
  float eps = 1e-6f;
  void* h = nullptr;      // [rows, width], written when delta != null
  void* y = nullptr;      // [rows, width]
  float* rstd = nullptr;  // [rows]
};

// grad_x = grad_h + d(y)/d(h)^T grad_y (the gradient of x and of delta alike); weight_partials[block, :] =
// per-block sums over rows of grad_y * h * rstd (the caller sums the rms_norm_bwd_blocks(rows) rows).
struct RmsNormBwdParams {
  ActDtype dtype = ActDtype::kBf16;
  int64_t rows = 0, width = 0;
  const void* grad_y = nullptr;      // [rows, width]
  const void* grad_h = nullptr;      // [rows, width] or null: the gradient reaching h from its other uses
  const void* h = nullptr;           // [rows, width]: the normalized input saved by the forward
  const float* weight = nullptr;     // [width]
  const void* weight_t = nullptr;    // or [width] in the activation dtype, read instead
  const float* rstd = nullptr;       // [rows]
  void* grad_x = nullptr;            // [rows, width]
  float* weight_partials = nullptr;  // [rms_norm_bwd_blocks(rows), width]
};

// True when the kernels handle this width (a multiple of 16 bytes of the dtype, at most 4,096 16-byte vectors).
bool rms_norm_supported(ActDtype dtype, int64_t width);
int64_t rms_norm_bwd_blocks(int64_t rows);
void launch_rms_norm_fwd(const RmsNormFwdParams& p, CUstream_st* stream);
void launch_rms_norm_bwd(const RmsNormBwdParams& p, CUstream_st* stream);

// ---------------------------------------------------------------------------------------------- LayerNorm
// SigLIP's pre-LN blocks: h = x + delta (rounded to the dtype, as ATen's add; h = x when delta is null),
// y = (h - mean) * rstd * weight + bias, mean and rstd = rsqrt(var + eps) (biased variance) in fp32.
// weight and bias are fp32 copies of the values the reference uses (the parameters cast to the activation dtype),
// or (weight_t, bias_t) those parameters themselves when they are in the activation dtype: the same values.
struct LayerNormFwdParams {
  ActDtype dtype = ActDtype::kBf16;
  int64_t rows = 0, width = 0;
  const void* x = nullptr;        // [rows, width]
  const void* delta = nullptr;    // [rows, width] or null
  const float* weight = nullptr;  // [width]
  const float* bias = nullptr;    // [width]
  // Or both in the activation dtype, read instead (no fp32 copies to make): set together.
  const void* weight_t = nullptr;
  const void* bias_t = nullptr;
  float eps = 1e-6f;
  void* h = nullptr;      // [rows, width], written when delta != null
  void* y = nullptr;      // [rows, width]
  float* mean = nullptr;  // [rows]
  float* rstd = nullptr;  // [rows]
};

// grad_x = grad_h + d(y)/d(h)^T grad_y (the gradient of x and of delta alike). weight_partials[block][0][:] =
// per-block sums of grad_y * (h - mean) * rstd (weight), [block][1][:] = of grad_y (bias); the caller sums the
// layer_norm_bwd_blocks(dtype, rows, width) blocks.
struct LayerNormBwdParams {
  ActDtype dtype = ActDtype::kBf16;
  int64_t rows = 0, width = 0;
  const void* grad_y = nullptr;  // [rows, width]
  const void* grad_h = nullptr;  // [rows, width] or null
  const void* h = nullptr;       // [rows, width]
  const float* weight = nullptr;
  const void* weight_t = nullptr;  // or the weight in the activation dtype, read instead
  const float* mean = nullptr;
  const float* rstd = nullptr;
  void* grad_x = nullptr;
  float* weight_partials = nullptr;  // [layer_norm_bwd_blocks(dtype, rows, width), 2, width]
};

bool layer_norm_supported(ActDtype dtype, int64_t width);
int64_t layer_norm_bwd_blocks(ActDtype dtype, int64_t rows, int64_t width);
void launch_layer_norm_fwd(const LayerNormFwdParams& p, CUstream_st* stream);
void launch_layer_norm_bwd(const LayerNormBwdParams& p, CUstream_st* stream);

// ---------------------------------------------------------------------------------------------- adaRMS
// Rows are [batch, tokens]; scale/shift/gate are rows of the batch (views of the [batch, 3 * width] modulation:
// `mod_stride` elements between batch rows, last dim contiguous).
//   h = x + round(gate * delta)          (the gated residual, rounded as ATen's mul then add; h = x without delta)
//   y = (h * rstd) * (1 + scale) + shift, rstd = rsqrt(mean(h^2) + eps)
struct AdaRmsNormFwdParams {
  ActDtype dtype = ActDtype::kBf16;
  int64_t batch = 0, tokens = 0, width = 0;
  const void* x = nullptr;      // [batch * tokens, width]
  const void* delta = nullptr;  // [batch * tokens, width] or null
  const void* gate = nullptr;   // [batch, width] rows, stride gate_stride; used only with delta
  const void* scale = nullptr;  // [batch, width] rows, stride mod_stride
  const void* shift = nullptr;  // [batch, width] rows, stride mod_stride
  int64_t gate_stride = 0, mod_stride = 0;
  float eps = 1e-6f;
  void* h = nullptr;  // written when delta != null
  void* y = nullptr;
  float* rstd = nullptr;  // [batch * tokens]
};

// The backward recomputes h from x, delta and gate (it saves x and delta, not h). Writes grad_x (the total
// gradient of h), grad_delta = grad_x * gate (with delta), and per-(split, batch) partial sums
// partials[split][b][0/1/2][:] of grad_y * h * rstd (scale), grad_y (shift), grad_x * delta (gate).
struct AdaRmsNormBwdParams {
  ActDtype dtype = ActDtype::kBf16;
  int64_t batch = 0, tokens = 0, width = 0;
  const void* grad_y = nullptr;
  const void* grad_h = nullptr;  // or null
  const void* x = nullptr;
  const void* delta = nullptr;  // or null
  const void* gate = nullptr;
  const void* scale = nullptr;
  int64_t gate_stride = 0, mod_stride = 0;
  const float* rstd = nullptr;
  void* grad_x = nullptr;
  void* grad_delta = nullptr;  // written when delta != null
  float* partials = nullptr;   // [adarms_norm_bwd_splits(tokens), batch, 3, width]
};

int64_t adarms_norm_bwd_splits(int64_t tokens);
void launch_adarms_norm_fwd(const AdaRmsNormFwdParams& p, CUstream_st* stream);
void launch_adarms_norm_bwd(const AdaRmsNormBwdParams& p, CUstream_st* stream);

// ---------------------------------------------------------------------------------------------- sums (reduce.cu)
// out[c] = sum over r < rows of partials[r * cols + c], summed in fp32 in a fixed order (deterministic) and
// rounded once to `dtype`: a norm backward's per-block partials -> its parameter (or adaRMS modulation) gradients
// in one launch, where an ATen sum plus a cast per gradient took two to four.
struct ColumnSumParams {
  ActDtype dtype = ActDtype::kBf16;
  int64_t rows = 0, cols = 0;
  const float* partials = nullptr;  // [rows, cols]
  void* out = nullptr;              // [cols]
};
void launch_column_sums(const ColumnSumParams& p, CUstream_st* stream);

// A Linear's bias gradient: out[c] = sum over the rows of g [rows, cols] (dense, 16-byte aligned, cols a multiple
// of the 16-byte vector), fp32 accumulation, one rounding to the dtype. Two launches: fp32 partial sums per chunk of
// rows ([bias_grad_chunks(rows, cols), cols] in `partials`), then launch_column_sums of them. Every warp reads
// 16-byte vectors along whole rows: in the H200 step it takes 2.5 ms for 113 calls, and the step A/B against
// ATen's column sums (VLATUNE_BIAS_GRAD_KERNEL=0) was flat (bench/RESULTS.md, seventh session).
struct BiasGradParams {
  ActDtype dtype = ActDtype::kBf16;
  int64_t rows = 0, cols = 0;
  const void* g = nullptr;    // [rows, cols]
  float* partials = nullptr;  // [bias_grad_chunks(rows, cols), cols]
  void* out = nullptr;        // [cols]
};
bool bias_grad_supported(ActDtype dtype, int64_t cols);
int64_t bias_grad_chunks(int64_t rows, int64_t cols);
void launch_bias_grad(const BiasGradParams& p, CUstream_st* stream);

// ---------------------------------------------------------------------------------------------- RoPE + QKV split
// The merged QKV GEMM outputs of both branches -> q [B, H, Tq, D], k/v [B, Hk, N, D] (contiguous, the attention
// layout), N = P + S (prefix positions first), with the half-split rotation of q and k in fp32:
//   out[i] = u*cos - v*sin, out[i + D/2] = v*cos + u*sin (u = x[i], v = x[i + D/2]; cos/sin [B, N, D/2] fp32).
// A prefix row holds [q (when prefix_q), k, v] heads; a suffix row [q, k, v]. Without prefix_q the queries cover
// the suffix positions only (Tq = S, the last layer's skipped prefix rows), else Tq = N.
struct RopeQkvParams {
  ActDtype dtype = ActDtype::kBf16;
  int64_t batch = 0, prefix_len = 0, suffix_len = 0;
  int heads = 0, kv_heads = 0, head_dim = 0;
  bool prefix_q = true;
  // Forward: read qkv_*, write q, k, v. Backward: read q, k, v (the gradients), write qkv_* (their gradients).
  void* qkv_prefix = nullptr;  // [B, P, ((prefix_q ? H : 0) + 2 Hk) * D]
  void* qkv_suffix = nullptr;  // [B, S, (H + 2 Hk) * D]
  const float* cos = nullptr;  // [B, N, D/2]
  const float* sin = nullptr;
  void* q = nullptr;  // token-major: [B, Tq, H, D] (Tq = P + S, or S without prefix_q)
  void* k = nullptr;  // [B, P + S, Hk, D]
  void* v = nullptr;  // [B, P + S, Hk, D]
};

bool rope_qkv_supported(ActDtype dtype, int head_dim);
void launch_rope_qkv_fwd(const RopeQkvParams& p, CUstream_st* stream);
void launch_rope_qkv_bwd(const RopeQkvParams& p, CUstream_st* stream);

// ---------------------------------------------------------------------------------------------- GeGLU
// merged [rows, 2F] = [gate | up] (the merged gate+up GEMM output) -> out [rows, F] = round(round(gelu_tanh(gate))
// * up) (ATen's two roundings). Backward: grad_merged [rows, 2F] = [round(round(g * up) * gelu'(gate)) |
// round(g * round(gelu(gate)))]. With act_out, the backward also writes the forward's output there (the down
// projection's input, for its weight gradient, so the backward does not rerun the forward kernel); act_out may be
// grad_out itself (each element is read before it is overwritten, by the same thread).
struct GegluParams {
  ActDtype dtype = ActDtype::kBf16;
  int64_t rows = 0, features = 0;  // F
  const void* merged = nullptr;
  const void* grad_out = nullptr;  // backward only
  void* out = nullptr;             // forward: [rows, F]; backward: grad_merged [rows, 2F]
  void* act_out = nullptr;         // backward only, optional: [rows, F]
};

bool geglu_supported(ActDtype dtype, int64_t features);
void launch_geglu_fwd(const GegluParams& p, CUstream_st* stream);
void launch_geglu_bwd(const GegluParams& p, CUstream_st* stream);

// ---------------------------------------------------------------------------------------------- GELU
// SigLIP's MLP activation on the fc1 output (bias already added by the GEMM): out = round(gelu_tanh(x)).
// Backward: grad_x = round(gelu'(x) * grad) and, with act_out (which may alias grad_out), the forward's output.
struct GeluParams {
  ActDtype dtype = ActDtype::kBf16;
  int64_t numel = 0;  // a multiple of 16 bytes of the dtype
  const void* x = nullptr;
  const void* grad_out = nullptr;  // backward only
  void* out = nullptr;             // forward: gelu(x); backward: grad_x
  void* act_out = nullptr;         // backward only, optional
};

bool gelu_supported(ActDtype dtype, int64_t numel);
void launch_gelu_fwd(const GeluParams& p, CUstream_st* stream);
void launch_gelu_bwd(const GeluParams& p, CUstream_st* stream);

}  // namespace vlatune::kernels
