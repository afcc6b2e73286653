// Fused FP8 quantization: torch-free params structs and raw-pointer launchers; kernels in fp8_quant.cu,
// the ATen reference and the torch entry points in fp8_ops.cpp (declared in fp8_ops.h). Design note: fp8.md.
//
// Tensorwise scaling: one fp32 scale per tensor, scale = fp8_max / amax (1 when amax is 0 or not finite), the
// cast is round-to-nearest-even of fp32(x) * scale with saturation to +-fp8_max (SATFINITE), and the GEMM gets
// the dequantization scale inv_scale = 1 / scale. The amax the scale comes from is read from device memory
// (`amax_in`): the amax of this tensor (current scaling, written by launch_fp8_amax first) or the maximum of an
// amax history (delayed scaling), so nothing waits for the host.
#pragma once

#include <cstdint>

#include "kernels/act_dtype.h"

namespace vlatune::kernels {

enum class Fp8Format { kE4m3, kE5m2 };  // e4m3fn (max 448): activations and weights; e5m2 (max 57344): gradients

constexpr float fp8_max_value(Fp8Format f) {
  return f == Fp8Format::kE4m3 ? 448.f : 57344.f;
}

// amax_out[0] = max(amax_out[0], max |x|) (atomic; amax_out must hold a value >= 0). x: `count` contiguous elements.
struct Fp8AmaxParams {
  ActDtype dtype = ActDtype::kBf16;
  int64_t count = 0;
  const void* x = nullptr;
  float* amax_out = nullptr;
};

// x [rows, cols] row-major (contiguous) -> in one pass, any of:
//   out   [rows, cols] FP8, rows `out_ld` bytes apart                  (the row-major copy: A of a GEMM)
//   out_t [cols, rows] FP8, rows `out_t_ld` bytes apart                (the transposed copy: x^T row-major)
//   amax_out[0] = max(amax_out[0], max |x|)                            (atomic: the amax for the next step)
// with scale = fp8_max / max(amax_in[i] for i in [0, amax_count), i != amax_skip). Block 0 also writes
// inv_scale_out[0] = 1 / scale and amax_used_out[0] = the amax it used (either may be null).
// rows and cols must be multiples of 16 (fp8_quantize_supported); out_ld and out_t_ld multiples of 16 bytes and the
// output pointers 16-byte aligned (a merged GEMM's member writes into rows / columns of one shared buffer).
struct Fp8QuantParams {
  ActDtype dtype = ActDtype::kBf16;
  Fp8Format format = Fp8Format::kE4m3;
  int64_t rows = 0, cols = 0;
  const void* x = nullptr;
  const float* amax_in = nullptr;
  int amax_count = 1;
  int amax_skip = -1;
  void* out = nullptr;  // or null
  int64_t out_ld = 0;
  void* out_t = nullptr;  // or null
  int64_t out_t_ld = 0;
  float* amax_out = nullptr;       // or null
  float* inv_scale_out = nullptr;  // or null
  float* amax_used_out = nullptr;  // or null
  // launch_fp8_geglu_quantize only: merged itself in e4m3 blocks (below), written in the same pass; or null.
  void* blocks_out = nullptr;
  float* blocks_inv_scale_out = nullptr;
};

// The GeGLU input kept for the backward in e4m3 blocks (recipe fp8.saved_geglu_inputs "e4m3-blocks"): merged
// [rows, 2F] as e4m3 [rows, 2F] (contiguous) and one fp32 dequantization scale per kGegluBlock consecutive
// elements of a row, [2F / kGegluBlock, rows] (block column major: the scales of a cast tile's 64 rows are 256
// contiguous bytes). A block's scale = 448 / max |block| (1 when that is 0 or not finite), its cast as the
// tensorwise one (x * scale, round to nearest even, saturating); the value read back is fp32(q) * (1 / scale)
// rounded to merged's dtype. F must be a multiple of kGegluBlock: a block is one cast tile's row.
constexpr int kGegluBlock = 64;

bool fp8_quantize_supported(int64_t rows, int64_t cols);
void launch_fp8_amax(const Fp8AmaxParams& p, CUstream_st* stream);
void launch_fp8_quantize(const Fp8QuantParams& p, CUstream_st* stream);

// The GELU producer writing FP8 directly (SigLIP's fc2 input): launch_fp8_quantize of gelu_tanh(x) rounded to
// p.dtype, exactly as the GELU kernel stores it, so the bytes equal launch_fp8_quantize(gelu(x)). With no output
// pointer (out, out_t) set, only amax_out is written: the amax pass of current scaling.
void launch_fp8_gelu_quantize(const Fp8QuantParams& p, CUstream_st* stream);

// The GeGLU producer writing FP8 directly: launch_fp8_quantize of act = geglu(merged) without act in memory.
// p.x is merged [rows, 2 * cols] (gate columns, then up columns; contiguous), p.cols the GeGLU width F. act is
// rounded to p.dtype before the cast, exactly as the geglu kernel stores it, so the bytes equal
// launch_fp8_quantize(geglu(merged)). With no output pointer (out, out_t) set, only amax_out is written: the amax
// pass of current scaling.
void launch_fp8_geglu_quantize(const Fp8QuantParams& p, CUstream_st* stream);

// The GeGLU backward, quantized, in one pass over merged [rows, 2F] and grad [rows, F] (dL/d act):
//   grad_merged = [d gate | d up] (values as the geglu backward kernel rounds them) cast per `grad_merged`
//     (format e5m2 usually; x = merged, cols = F; out [rows, 2F] and out_t [2F, rows] with their ld; amax_out,
//     inv_scale_out, amax_used_out as in launch_fp8_quantize; amax_in / amax_skip: its scale);
//   act^T = geglu(merged)^T cast to e4m3 with scale = 448 / act_amax_in[0] into act_t [F, rows] (row stride
//     act_t_ld bytes) and act_inv_scale_out[0] = 1 / scale: the down projection's saved input, recomputed.
// No output set in grad_merged (out, out_t) and act_t null: only grad_merged's amax (current scaling's first pass).
// With merged_blocks set, merged is read from its e4m3 blocks (grad_merged.x unused; may be null).
struct Fp8GegluBwdParams {
  Fp8QuantParams grad_merged;
  const void* merged_blocks = nullptr;             // e4m3 [rows, 2F], or null
  const float* merged_blocks_inv_scale = nullptr;  // [2F / kGegluBlock, rows]
  const void* grad = nullptr;
  const float* act_amax_in = nullptr;
  void* act_t = nullptr;  // or null
  int64_t act_t_ld = 0;
  float* act_inv_scale_out = nullptr;  // or null
};
void launch_fp8_geglu_backward_quantize(const Fp8GegluBwdParams& p, CUstream_st* stream);

// The GELU backward, quantized, in one pass over pre [rows, F] and grad [rows, F] (dL/d gelu_tanh(pre)): SigLIP's
// fc1 output and fc2's input gradient, where fc1 and fc2 both run in FP8.
//   grad_pre = gelu_backward(grad, pre) (values as the GELU backward kernel rounds them) cast per `grad_pre` (x = pre,
//     cols = F; out [rows, F], out_t [F, rows], amax_out, inv_scale_out, amax_used_out, amax_in / amax_skip as in
//     launch_fp8_quantize): fc1's output gradient, both layouts;
//   act^T = gelu_tanh(pre)^T as the GELU kernel rounds it, cast to e4m3 with scale = 448 / act_amax_in[0], into act_t
//     [F, rows] (row stride act_t_ld bytes) and act_inv_scale_out[0] = 1 / scale: fc2's input, rebuilt;
//   bias_partials [ceil(rows / 64), F] fp32 (or null): row r / 64 of it holds the sums of grad_pre's values (before
//     the cast) over rows r..r+63 of each column, which launch_column_sums turns into fc1's bias gradient.
// No output set in grad_pre (out, out_t), act_t and bias_partials null: only grad_pre's amax (current scaling's first
// pass).
struct Fp8GeluBwdParams {
  Fp8QuantParams grad_pre;
  const void* grad = nullptr;
  const float* act_amax_in = nullptr;
  void* act_t = nullptr;  // or null
  int64_t act_t_ld = 0;
  float* act_inv_scale_out = nullptr;  // or null
  float* bias_partials = nullptr;      // or null
};
constexpr int kGeluBwdPartialRows = 64;  // rows of grad_pre summed into one row of bias_partials
void launch_fp8_gelu_backward_quantize(const Fp8GeluBwdParams& p, CUstream_st* stream);

}  // namespace vlatune::kernels
