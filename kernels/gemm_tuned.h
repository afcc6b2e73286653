// Tuned bf16/fp16 GEMMs (design note: gemm.md). On CUDA, each distinct problem (shapes, transposes, leading
// dimensions, epilogue, pointer alignment class, dtype, device) is timed once, on its first call: the ATen form
// (cublasGemmEx through at::mm_out / at::addmm_out) against every cuBLASLt heuristic candidate (gemm_lt.h); the
// fastest is kept for every later call (no synchronization after the first). The results stay those of one bf16
// (fp16) GEMM rounding whatever is chosen: fp32 accumulation, split-K partial sums in fp32 only, bias added before
// the single rounding.
//
// Everywhere else (CPU, a CPU-only build, fp32/fp64 operands, tuning off) each function runs exactly the ATen op it
// names, so results are bitwise ATen's. Off by default: in the full Pi0.5 step on the H200 the kept candidates were
// no faster than ATen's GEMMs (gemm.md, "Measured in the step"). Switch: VLATUNE_GEMM_TUNING=1 (or
// set_gemm_tuning(true)); VLATUNE_GEMM_TUNING=bias tunes only the bias-gradient GEMMs.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "kernels/gemm_lt.h"

namespace vlatune::kernels {

// What is tuned: nothing; every GEMM; or only the weight-gradient GEMMs of Linears with a bias
// (tuned_mm_row_sums: ATen's GEMM and a separate sum against cuBLASLt's GEMM with the BGRADB epilogue), every
// other GEMM running ATen's as with tuning off.
enum class GemmTuning { kOff, kAll, kBiasGradients };

// From the environment variable VLATUNE_GEMM_TUNING (gemm_tuning_mode_from_env), read at the first query;
// set_gemm_tuning overrides it for the process (tests, benchmarks). gemm_tuning_enabled: the mode is not kOff.
GemmTuning gemm_tuning_mode();
bool gemm_tuning_enabled();
void set_gemm_tuning(GemmTuning mode);
void set_gemm_tuning(bool enabled);  // kAll or kOff
// A value of VLATUNE_GEMM_TUNING -> the mode: "1", "on", "true", "yes" (any case) kAll; "bias" kBiasGradients;
// unset (null), empty or anything else kOff.
GemmTuning gemm_tuning_mode_from_env(const char* value);

// True when the functions below take the tuned path for operands like t: a CUDA build, t on CUDA in bf16 or fp16,
// tuning on. (The operands must then also agree in dtype and device and be 2-D with sizes > 0; otherwise ATen.)
bool gemm_tuning_applies(const at::Tensor& t);

// a [M, K] @ b [K, N] (+ bias [N], added to every row, in the epilogue). Operands with one unit stride are read in
// place (row- or column-major, any leading dimension: strided column views, transposed views, misaligned row
// views); others are copied first, as ATen does. The output is a new contiguous [M, N] tensor. The tuned path has
// no autograd of its own (tuned_linear is the differentiable form). Elsewhere: at::mm(a, b) or
// at::addmm(bias, a, b).
at::Tensor tuned_mm(const at::Tensor& a, const at::Tensor& b, const at::Tensor& bias = at::Tensor());

struct MmRowSums {
  at::Tensor out;       // a @ b [M, N]
  at::Tensor row_sums;  // a.sum(1) [M], in a's dtype
};
// {a @ b, a.sum(1)}: with a = g^T and b = x, the weight gradient g^T x of a Linear and its bias gradient (the sum
// of g over rows), the sum fused into the GEMM (cuBLASLt's BGRADB epilogue) when a cuBLASLt candidate is kept,
// else at::mm_out + at::sum_out. Elsewhere: {at::mm(a, b), a.sum(1)}.
MmRowSums tuned_mm_row_sums(const at::Tensor& a, const at::Tensor& b);

// y = x W^T (+ b) with no autograd node of its own (the forward of custom autograd functions): tuned_mm on x's
// rows (x [..., K], weight [N, K], bias [N], all of x's dtype and device), else at::linear(x, weight, bias).
at::Tensor tuned_linear_forward(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);

// y = x W^T (+ b) as one autograd node whose GEMMs are tuned: forward x W^T + b (bias epilogue), backward
// dx = g W, dW = g^T x and db = sum of g over rows (fused into dW's GEMM). Saves x and W, as at::linear does.
// Gradients come out in the inputs' dtype. Taken when tuned_linear_forward's conditions hold, and with tuning off
// for CUDA bf16/fp16 Linears with a bias (ATen's GEMMs, db by kernels::bias_grad); otherwise (CPU, other dtypes,
// mixed dtypes, no bias with tuning off) this is at::linear(x, weight, bias) itself, autograd included.
at::Tensor tuned_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);

// The tuning cache: one record per problem (what was measured, what was kept, how often it ran). Empty on the CPU.
std::vector<GemmTuneRecord> gemm_tuning_records();
// One line for logs, e.g. "GEMM tuning: 24 problems, cuBLASLt kept for 15 (ATen for 9); 4080 calls, estimated GPU
// time 1901.2 ms with the kept algorithms vs 2010.9 ms with ATen's (-5.4%)". Empty when nothing was tuned.
std::string gemm_tuning_summary();
// Forgets every choice (the next call of each problem tunes again).
void clear_gemm_tuning_cache();

}  // namespace vlatune::kernels
