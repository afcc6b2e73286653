// cuBLASLt GEMMs with a per-problem autotune cache (design note: gemm.md). Torch-free: raw pointers and problems as
// cuBLAS states them (column-major). The torch side (gemm_tuned.h) maps row-major tensors onto these problems and
// supplies the ATen form of each one (cublasGemmEx through at::mm_out / at::addmm_out), which is always one of the
// candidates: on the first call of a problem, that baseline and every cuBLASLt heuristic candidate are timed on the
// caller's stream and the fastest is kept; later calls go straight to it.
//
// In a CPU-only build only the problem key, describe() and the (empty) records exist; gemm_lt_run_tuned is CUDA-only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

struct CUstream_st;      // cudaStream_t without <cuda_runtime.h>
struct cublasLtContext;  // cublasLtHandle_t without <cublasLt.h>

namespace vlatune::kernels {

enum class GemmDtype : uint8_t { kBf16, kFp16 };

// kBias: D[i, j] += bias[i] (bias: m elements, read), the Linear forward's bias.
// kBiasGradB: bias[j] = sum over the GEMM's k of op(B)[:, j] (bias: n elements, written), the bias gradient of a
// weight-gradient GEMM (cuBLASLt's BGRADB epilogue).
enum class GemmEpilogue : uint8_t { kNone, kBias, kBiasGradB };

// Bits of GemmProblem::aligned: which pointers are 16-byte aligned (the pointer alignment class of the key).
constexpr uint8_t kGemmAlignA = 1, kGemmAlignB = 2, kGemmAlignD = 4;

// D [m x n] (column-major, leading dimension ldd) = op(A) op(B) (+ epilogue): fp32 accumulation and scale,
// alpha = 1, beta = 0 (D is written, never read). A is [m x k] after op (stored [k x m] when transa), B is [k x n]
// after op (stored [n x k] when transb). A, B, D and the bias share the dtype; the bias pointer must be 16-byte
// aligned. Every field is part of the cache key.
struct GemmProblem {
  int device = 0;
  GemmDtype dtype = GemmDtype::kBf16;
  bool transa = false, transb = false;
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldd = 0;
  GemmEpilogue epilogue = GemmEpilogue::kNone;
  uint8_t aligned = 0;  // kGemmAlign* bits
};
bool operator<(const GemmProblem& a, const GemmProblem& b);
bool operator==(const GemmProblem& a, const GemmProblem& b);
// "bf16 TN m=2048 n=22784 k=2048 lda=2048 ldb=2048 ldd=2048 bias align16=ABD cuda:0"
std::string describe(const GemmProblem& p);

struct GemmPointers {
  const void* a = nullptr;
  const void* b = nullptr;
  void* d = nullptr;
  void* bias = nullptr;  // kBias: read; kBiasGradB: written; else unused
};

// Where the GEMM runs: the cuBLASLt handle, the stream, and a workspace that only work ordered on this stream uses.
struct GemmContext {
  cublasLtContext* handle = nullptr;
  CUstream_st* stream = nullptr;
  void* workspace = nullptr;  // 256-byte aligned
  size_t workspace_bytes = 0;
};

// The ATen form of the same problem (same outputs, D and the bias gradient included), enqueued on the context's
// stream by run(ctx): the baseline candidate. A plain function pointer and its argument: no allocation per call.
struct GemmBaseline {
  void (*run)(void* ctx) = nullptr;
  void* ctx = nullptr;
};

// What the first call of a problem measured and chose.
struct GemmTuneRecord {
  GemmProblem problem;
  int chosen = -1;                  // -1: the ATen baseline; i >= 0: cuBLASLt heuristic candidate #i
  float baseline_ms = 0;            // median of 3 timed runs (after 1 warm-up), L2 mostly cold
  std::vector<float> candidate_ms;  // per heuristic candidate, in the heuristic's order; +inf: it failed to run
  float chosen_ms = 0;              // the kept time (the minimum of the above)
  int64_t calls = 0;                // calls of this problem so far, the tuning call included
  std::string note;                 // why no cuBLASLt candidate was timed, when none was
};

// Runs the problem (current device = p.device): with its cached choice; on first sight, times the baseline and
// every cuBLASLt heuristic candidate (up to 16) on ctx.stream (this synchronizes the stream once), keeps the
// fastest, then runs it so that the outputs are what every later call of the problem computes. A stream that is
// being captured into a CUDA graph is never synchronized: an unknown problem then runs the baseline, uncached.
// Thread-safe (the autograd engine runs backward on its own thread): the cache is guarded by a mutex that is not
// held while timing. Throws std::runtime_error when the kept cuBLASLt algorithm fails.
// CUDA builds only.
void gemm_lt_run_tuned(const GemmProblem& p, const GemmPointers& ptr, const GemmContext& ctx,
                       const GemmBaseline& baseline);

// The cache, sorted by problem.
std::vector<GemmTuneRecord> gemm_lt_records();
void gemm_lt_clear();

}  // namespace vlatune::kernels
