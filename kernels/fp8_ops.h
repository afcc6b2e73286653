// Torch entry points of the fused FP8 quantization (kernels in fp8_quant.cu, contract in fp8.h, design in
// fp8.md) and the FP8 GEMM. On CUDA with fp32/bf16 inputs the kernels run; elsewhere (CPU) the ATen reference of
// the same contract (same scale, same rounding, same saturation), so the FP8 Linear runs and is tested on the CPU.
#pragma once

#include <ATen/core/Tensor.h>
#include <string>
#include <vector>

#include "kernels/fp8.h"

namespace vlatune::kernels {

at::ScalarType fp8_dtype(Fp8Format f);  // kFloat8_e4m3fn | kFloat8_e5m2

// amax[0] = max(amax[0], max |x|). amax: a 1-element fp32 tensor on x's device holding a value >= 0.
void fp8_amax_into(const at::Tensor& x, const at::Tensor& amax);

// Where fp8_quantize_into writes. Any output may be undefined (not written).
struct Fp8QuantOutputs {
  at::Tensor out;        // [rows, cols] FP8, last dim contiguous (e.g. rows [r0, r0 + rows) of a stacked buffer)
  at::Tensor out_t;      // [cols, rows] FP8, last dim contiguous (e.g. columns [r0, r0 + rows) of [cols, R])
  at::Tensor amax_out;   // [1] fp32: max(amax_out, max |x|)
  at::Tensor inv_scale;  // fp32, one element: 1 / scale (the GEMM's dequantization scale)
  at::Tensor amax_used;  // fp32, one element: the amax the scale came from
};

// x [rows, cols] (rows, cols multiples of 16) -> FP8 with scale = fp8_max / max(amax_in[i], i != amax_skip)
// (1 when that is 0 or not finite). amax_in: 1-D fp32 on x's device (1 entry: current scaling; the history:
// delayed scaling). Kernel on CUDA (fp32/bf16), else fp8_quantize_into_ref.
void fp8_quantize_into(const at::Tensor& x, Fp8Format format, const at::Tensor& amax_in, int64_t amax_skip,
                       const Fp8QuantOutputs& outputs);
void fp8_quantize_into_ref(const at::Tensor& x, Fp8Format format, const at::Tensor& amax_in, int64_t amax_skip,
                           const Fp8QuantOutputs& outputs);

// The GELU producer writing FP8 (fp8.h launch_fp8_gelu_quantize): gelu_tanh(pre) [rows, F] cast to e4m3 exactly as
// fp8_quantize_into(gelu(pre), kE4m3, amax_in, amax_skip, outputs) would, without the GELU output in memory (kernel on
// CUDA for a 16-byte aligned bf16/fp32 pre; that composition elsewhere). pre: contiguous [rows, F], rows and F
// multiples of 16.
void fp8_gelu_quantize_into(const at::Tensor& pre, const at::Tensor& amax_in, int64_t amax_skip,
                            const Fp8QuantOutputs& outputs);
// amax[0] = max(amax[0], max |gelu_tanh(pre)|).
void fp8_gelu_amax_into(const at::Tensor& pre, const at::Tensor& amax);

// merged [rows, 2F] in e4m3 blocks (fp8.h kGegluBlock; recipe fp8.saved_geglu_inputs "e4m3-blocks"): data
// [rows, 2F] Float8_e4m3fn, inv_scale [2F / kGegluBlock, rows] fp32 (block j of row r at [j][r]; fp8.h says why).
struct GegluBlocks {
  at::Tensor data, inv_scale;
  bool defined() const { return data.defined(); }
};
bool geglu_blocks_supported(int64_t f);                   // F a positive multiple of kGegluBlock
GegluBlocks geglu_blocks_like(const at::Tensor& merged);  // uninitialized, for merged [rows, 2F]
// The blocks of merged by ATen on any device: the kernels' bytes (the reference of the GPU tests).
void geglu_blocks_quantize_ref(const at::Tensor& merged, const GegluBlocks& out);
// The values read back: fp32(q) * inv_scale per block, rounded to `dtype` ([rows, 2F]).
at::Tensor geglu_blocks_dequantize(const GegluBlocks& blocks, at::ScalarType dtype);

// The GeGLU producer writing FP8 (fp8.h launch_fp8_geglu_quantize): act = geglu(merged) [rows, F] cast to e4m3
// exactly as fp8_quantize_into(geglu(merged), kE4m3, amax_in, amax_skip, outputs) would, without act in memory
// (kernel on CUDA for contiguous bf16/fp32 merged with rows and F multiples of 16; that composition elsewhere).
// With `blocks` defined, merged itself goes to them in the same pass (geglu_blocks_quantize_ref's bytes).
void fp8_geglu_quantize_into(const at::Tensor& merged, const at::Tensor& amax_in, int64_t amax_skip,
                             const Fp8QuantOutputs& outputs, const GegluBlocks& blocks = {});
// amax[0] = max(amax[0], max |geglu(merged)|).
void fp8_geglu_amax_into(const at::Tensor& merged, const at::Tensor& amax);

// The GeGLU backward, quantized (fp8.h launch_fp8_geglu_backward_quantize): from grad = dL/d geglu(merged) [rows, F]
// and merged [rows, 2F], in one pass:
//   grad_merged = geglu_backward(grad, merged) [rows, 2F] cast to `format` with scale from amax_in / amax_skip into
//     grad_merged.{out [rows, 2F], out_t [2F, rows], amax_out, inv_scale, amax_used} (any may be undefined);
//   act_t [F, rows] = geglu(merged)^T in e4m3 with scale 448 / act_amax[0], and act_inv_scale = 1 / that scale.
// Equal byte for byte to fp8_quantize_into(geglu_backward(grad, merged), ...) and
// fp8_quantize_into(geglu(merged), kE4m3, act_amax, -1, {out_t = act_t}); that composition on the CPU.
struct Fp8GegluGradOutputs {
  Fp8QuantOutputs grad_merged;
  at::Tensor act_t;          // [F, rows] e4m3, last dim contiguous, or undefined
  at::Tensor act_inv_scale;  // one fp32 element, or undefined
};
// With `blocks` defined, merged is read from them (pass an undefined `merged`): as if merged were
// geglu_blocks_dequantize(blocks, grad's dtype).
void fp8_geglu_backward_quantize_into(const at::Tensor& grad, const at::Tensor& merged, Fp8Format format,
                                      const at::Tensor& amax_in, int64_t amax_skip, const at::Tensor& act_amax,
                                      const Fp8GegluGradOutputs& outputs, const GegluBlocks& blocks = {});
// amax[0] = max(amax[0], max |geglu_backward(grad, merged)|) (merged from `blocks` as above).
void fp8_geglu_backward_amax_into(const at::Tensor& grad, const at::Tensor& merged, const at::Tensor& amax,
                                  const GegluBlocks& blocks = {});

// The GELU backward, quantized (fp8.h launch_fp8_gelu_backward_quantize): from grad = dL/d gelu_tanh(pre) [rows, F]
// and pre [rows, F] (contiguous, rows and F multiples of 16), in one pass:
//   grad_pre = gelu_backward(grad, pre) [rows, F] cast to `format` with scale from amax_in / amax_skip into
//     grad_pre.{out [rows, F], out_t [F, rows], amax_out, inv_scale, amax_used} (any may be undefined);
//   act_t [F, rows] = gelu(pre)^T in e4m3 with scale 448 / act_amax[0], and act_inv_scale = 1 / that scale;
//   bias_grad [F] (pre's dtype) = the column sums of grad_pre's values in fp32, rounded once (bias_grad's contract;
//     the order of the fp32 additions differs).
// The casts equal fp8_quantize_into(gelu_backward(grad, pre), ...) and fp8_quantize_into(gelu(pre), kE4m3, act_amax,
// -1, {out_t = act_t}) byte for byte; that composition, and bias_grad, on the CPU.
struct Fp8GeluGradOutputs {
  Fp8QuantOutputs grad_pre;
  at::Tensor act_t;          // [F, rows] e4m3, last dim contiguous, or undefined
  at::Tensor act_inv_scale;  // one fp32 element, or undefined
  at::Tensor bias_grad;      // [F] in pre's dtype, contiguous, or undefined
};
void fp8_gelu_backward_quantize_into(const at::Tensor& grad, const at::Tensor& pre, Fp8Format format,
                                     const at::Tensor& amax_in, int64_t amax_skip, const at::Tensor& act_amax,
                                     const Fp8GeluGradOutputs& outputs);
// amax[0] = max(amax[0], max |gelu_backward(grad, pre)|).
void fp8_gelu_backward_amax_into(const at::Tensor& grad, const at::Tensor& pre, const at::Tensor& amax);

// Current scaling in one call: amax pass + cast pass. Returns the requested layouts and the dequantization scale.
struct Fp8Tensor {
  at::Tensor data;       // [rows, cols] row-major, when requested
  at::Tensor data_t;     // [cols, rows] row-major (x^T), when requested
  at::Tensor inv_scale;  // 0-dim fp32
  at::Tensor amax_used;  // [1] fp32
};
Fp8Tensor fp8_quantize(const at::Tensor& x, Fp8Format format, bool row_major, bool transposed);

// Which cuBLASLt algorithm an FP8 GEMM runs on CUDA (recipe fp8.gemm_algorithm). kHeuristic: the heuristic's first
// choice, as at::_scaled_mm runs it. kTimed: the fastest of the heuristic's first kFp8TimedCandidates, each timed on
// the GEMM problem's first call (shape, leading dimensions, dtypes, fast accumulation, bias) and kept for the
// process; a problem whose first call comes during stream capture, or that cuBLASLt cannot run, takes at::_scaled_mm.
enum class Fp8GemmAlgorithm { kHeuristic, kTimed };
inline constexpr int kFp8TimedCandidates = 8;

// a [m, k] row-major FP8, b [k, n] column-major FP8 (b.t() contiguous), inv_a / inv_b their dequantization scales
// (one element fp32): (a * inv_a)(b * inv_b) (+ bias [n]) in `out_dtype`. On CUDA through cuBLASLt (k, n multiples
// of 16; a bias is added in its epilogue, before the one rounding, for a bf16 output, else by an add after it); on
// the CPU the same product of the dequantized operands in fp32, bias added before the rounding (an emulation: the
// tests' path; `algorithm` does not apply).
at::Tensor fp8_mm(const at::Tensor& a, const at::Tensor& b, const at::Tensor& inv_a, const at::Tensor& inv_b,
                  at::ScalarType out_dtype, bool fast_accum, const at::Tensor& bias = {},
                  Fp8GemmAlgorithm algorithm = Fp8GemmAlgorithm::kHeuristic);

// What kTimed measured for one GEMM problem (cuBLAS's column-major terms: D [m x n] = A^T B, k deep).
struct Fp8TimedGemm {
  std::string problem;  // "m=2048 n=18432 k=16384 lda=16384 ldb=16384 e4m3 x e4m3 -> bf16 fast-accum cuda:0"
  std::vector<float> candidate_ms;  // per heuristic candidate, in its order; +inf: it failed to run
  int chosen = -1;                  // index into candidate_ms; -1: none ran (at::_scaled_mm runs the problem)
  int64_t calls = 0;                // calls so far, the timing call included
};
// Every problem kTimed has seen in this process, in first-call order.
std::vector<Fp8TimedGemm> fp8_timed_gemms();
// One line for a run's log: how many problems were timed, how many left the heuristic's first choice, and the time
// that saves per step by the first-call timings (each problem's calls spread over `steps`). Empty without records.
std::string describe_fp8_timed_gemms(const std::vector<Fp8TimedGemm>& timed, int64_t steps);

}  // namespace vlatune::kernels
