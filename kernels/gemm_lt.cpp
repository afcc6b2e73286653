// cuBLASLt GEMMs and their autotune cache (contract: gemm_lt.h; design: gemm.md). Torch-free. The problem key and
// describe() build everywhere; the cuBLASLt part only in CUDA builds (a CPU build has no records).
#include "kernels/gemm_lt.h"

#include <sstream>
#include <tuple>

#ifdef VLATUNE_HAVE_CUDA
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <limits>
#include <map>
#include <mutex>
#include <stdexcept>

#include "kernels/cuda_check.h"
#endif

namespace vlatune::kernels {

namespace {

auto key_of(const GemmProblem& p) {
  return std::tie(p.device, p.dtype, p.transa, p.transb, p.m, p.n, p.k, p.lda, p.ldb, p.ldd, p.epilogue, p.aligned);
}

}  // namespace

bool operator<(const GemmProblem& a, const GemmProblem& b) {
  return key_of(a) < key_of(b);
}

bool operator==(const GemmProblem& a, const GemmProblem& b) {
  return key_of(a) == key_of(b);
}

std::string describe(const GemmProblem& p) {
  std::ostringstream os;
  os << (p.dtype == GemmDtype::kBf16 ? "bf16 " : "fp16 ") << (p.transa ? 'T' : 'N') << (p.transb ? 'T' : 'N')
     << " m=" << p.m << " n=" << p.n << " k=" << p.k << " lda=" << p.lda << " ldb=" << p.ldb << " ldd=" << p.ldd;
  if (p.epilogue == GemmEpilogue::kBias) os << " bias";
  if (p.epilogue == GemmEpilogue::kBiasGradB) os << " bgradb";
  os << " align16=" << ((p.aligned & kGemmAlignA) ? "A" : "") << ((p.aligned & kGemmAlignB) ? "B" : "")
     << ((p.aligned & kGemmAlignD) ? "D" : "") << (p.aligned == 0 ? "-" : "") << " cuda:" << p.device;
  return os.str();
}

#ifdef VLATUNE_HAVE_CUDA

namespace {

constexpr int kMaxCandidates = 16;  // heuristic candidates requested per problem
constexpr int kTimedRuns = 3;       // after one warm-up; the median is kept

struct Entry {
  GemmTuneRecord record;
  cublasLtMatmulAlgo_t algo{};  // the kept candidate's algorithm (record.chosen >= 0)
};

std::mutex& cache_mutex() {
  static std::mutex m;
  return m;
}

// Never destroyed: the autograd engine's device threads may still run GEMMs while static destructors run at exit.
std::map<GemmProblem, Entry>& cache() {
  static auto* c = new std::map<GemmProblem, Entry>();
  return *c;
}

[[noreturn]] void fail(const char* what, cublasStatus_t status, const GemmProblem& p) {
  throw std::runtime_error(std::string("cuBLASLt: ") + what + " failed with status " +
                           std::to_string(static_cast<int>(status)) + " (" + describe(p) + ")");
}

// The descriptors of one problem, in stack storage (the *Init functions allocate nothing): rebuilt for each call,
// so concurrent callers of one problem (forward and backward threads) share no mutable descriptor.
struct LtDescs {
  cublasLtMatmulDescOpaque_t op{};
  cublasLtMatrixLayoutOpaque_t a{}, b{}, d{};

  cublasStatus_t init(const GemmProblem& p, void* bias) {
    const cudaDataType_t type = p.dtype == GemmDtype::kBf16 ? CUDA_R_16BF : CUDA_R_16F;
    const cublasOperation_t ta = p.transa ? CUBLAS_OP_T : CUBLAS_OP_N, tb = p.transb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    if (p.epilogue == GemmEpilogue::kBias) epilogue = CUBLASLT_EPILOGUE_BIAS;
    if (p.epilogue == GemmEpilogue::kBiasGradB) epilogue = CUBLASLT_EPILOGUE_BGRADB;
    cublasStatus_t s = cublasLtMatmulDescInit(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    auto set = [&](cublasLtMatmulDescAttributes_t attr, const void* value, size_t bytes) {
      if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulDescSetAttribute(&op, attr, value, bytes);
    };
    set(CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta));
    set(CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb));
    set(CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue));
    // The bias (or bias gradient) has D's type: the attribute's default.
    if (p.epilogue != GemmEpilogue::kNone) set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias));
    auto layout = [&](cublasLtMatrixLayoutOpaque_t& l, int64_t rows, int64_t cols, int64_t ld) {
      if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatrixLayoutInit(&l, type, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld);
    };
    layout(a, p.transa ? p.k : p.m, p.transa ? p.m : p.k, p.lda);
    layout(b, p.transb ? p.n : p.k, p.transb ? p.k : p.n, p.ldb);
    layout(d, p.m, p.n, p.ldd);
    return s;
  }
};

cublasStatus_t lt_matmul(const GemmContext& c, LtDescs& d, const GemmPointers& ptr, const cublasLtMatmulAlgo_t& algo) {
  const float one = 1.0f, zero = 0.0f;
  // beta = 0: C is not read; it is passed as D, with D's layout.
  return cublasLtMatmul(c.handle, &d.op, &one, ptr.a, &d.a, ptr.b, &d.b, &zero, ptr.d, &d.d, ptr.d, &d.d, &algo,
                        c.workspace, c.workspace_bytes, c.stream);
}

// The heuristic's candidates for the problem (at most kMaxCandidates, each usable with this workspace).
// Restrictions that keep the results those of one bf16 GEMM rounding: split-K partial sums only in the compute
// type (fp32) in the workspace; the in-place and output-type reductions would add bf16/fp16 roundings.
std::vector<cublasLtMatmulAlgo_t> heuristic_candidates(const GemmProblem& p, LtDescs& d, const GemmContext& c,
                                                       std::string* note) {
  cublasLtMatmulPreferenceOpaque_t pref{};
  cublasStatus_t s = cublasLtMatmulPreferenceInit(&pref);
  auto set = [&](cublasLtMatmulPreferenceAttributes_t attr, const void* value, size_t bytes) {
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulPreferenceSetAttribute(&pref, attr, value, bytes);
  };
  const uint64_t workspace = c.workspace_bytes;
  set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace));
  const uint32_t reductions = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  set(CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reductions, sizeof(reductions));
  // The alignment class: 16 bytes where the pointer has it, else the element size (any pointer of the dtype).
  const uint32_t align_a = (p.aligned & kGemmAlignA) ? 16 : 2, align_b = (p.aligned & kGemmAlignB) ? 16 : 2,
                 align_d = (p.aligned & kGemmAlignD) ? 16 : 2;
  set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof(align_a));
  set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof(align_b));
  set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d, sizeof(align_d));
  set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d, sizeof(align_d));
  std::array<cublasLtMatmulHeuristicResult_t, kMaxCandidates> results{};
  int got = 0;
  if (s == CUBLAS_STATUS_SUCCESS)
    s = cublasLtMatmulAlgoGetHeuristic(c.handle, &d.op, &d.a, &d.b, &d.d, &d.d, &pref, kMaxCandidates, results.data(),
                                       &got);
  std::vector<cublasLtMatmulAlgo_t> out;
  if (s != CUBLAS_STATUS_SUCCESS) {
    *note = "heuristic status " + std::to_string(static_cast<int>(s));
    return out;
  }
  for (int i = 0; i < got; ++i)
    if (results[i].state == CUBLAS_STATUS_SUCCESS && results[i].workspaceSize <= c.workspace_bytes)
      out.push_back(results[i].algo);
  if (out.empty()) *note = "no cuBLASLt algorithm for this problem";
  return out;
}

// CUDA events for the timed runs of one tuning, destroyed on every exit path.
struct Events {
  std::array<cudaEvent_t, 2 * kTimedRuns> ev{};
  Events() {
    try {
      for (auto& e : ev) VLATUNE_CUDA_CHECK(cudaEventCreate(&e));
    } catch (...) {
      destroy();
      throw;
    }
  }
  ~Events() { destroy(); }
  void destroy() {
    for (auto& e : ev)
      if (e != nullptr) cudaEventDestroy(e), e = nullptr;
  }
  Events(const Events&) = delete;
  Events& operator=(const Events&) = delete;
};

// Median GPU time (ms) of kTimedRuns runs of `launch` after one warm-up, on the context's stream; +inf when a launch
// reports failure. Before each timed run the workspace is overwritten (32 MiB: most of the operands leave L2, as in
// the training step, where every GEMM reads operands another kernel wrote long before).
template <typename Launch>
float median_ms(const GemmContext& c, Events& events, Launch&& launch) {
  if (!launch()) return std::numeric_limits<float>::infinity();
  for (int r = 0; r < kTimedRuns; ++r) {
    if (c.workspace != nullptr) VLATUNE_CUDA_CHECK(cudaMemsetAsync(c.workspace, r, c.workspace_bytes, c.stream));
    VLATUNE_CUDA_CHECK(cudaEventRecord(events.ev[2 * r], c.stream));
    if (!launch()) return std::numeric_limits<float>::infinity();
    VLATUNE_CUDA_CHECK(cudaEventRecord(events.ev[2 * r + 1], c.stream));
  }
  VLATUNE_CUDA_CHECK(cudaEventSynchronize(events.ev[2 * kTimedRuns - 1]));
  std::array<float, kTimedRuns> ms{};
  for (int r = 0; r < kTimedRuns; ++r)
    VLATUNE_CUDA_CHECK(cudaEventElapsedTime(&ms[r], events.ev[2 * r], events.ev[2 * r + 1]));
  std::sort(ms.begin(), ms.end());
  return ms[kTimedRuns / 2];
}

Entry tune(const GemmProblem& p, const GemmPointers& ptr, const GemmContext& c, const GemmBaseline& baseline) {
  Entry e;
  e.record.problem = p;
  LtDescs d;
  const cublasStatus_t s = d.init(p, ptr.bias);
  std::vector<cublasLtMatmulAlgo_t> algos;
  if (s == CUBLAS_STATUS_SUCCESS)
    algos = heuristic_candidates(p, d, c, &e.record.note);
  else
    e.record.note = "descriptor status " + std::to_string(static_cast<int>(s));
  Events events;
  e.record.baseline_ms = median_ms(c, events, [&] {
    baseline.run(baseline.ctx);
    return true;
  });
  e.record.chosen = -1;
  e.record.chosen_ms = e.record.baseline_ms;
  for (size_t i = 0; i < algos.size(); ++i) {
    const float ms = median_ms(c, events, [&] { return lt_matmul(c, d, ptr, algos[i]) == CUBLAS_STATUS_SUCCESS; });
    e.record.candidate_ms.push_back(ms);
    if (ms < e.record.chosen_ms) {
      e.record.chosen = static_cast<int>(i);
      e.record.chosen_ms = ms;
      e.algo = algos[i];
    }
  }
  return e;
}

}  // namespace

void gemm_lt_run_tuned(const GemmProblem& p, const GemmPointers& ptr, const GemmContext& ctx,
                       const GemmBaseline& baseline) {
  int chosen = -1;
  cublasLtMatmulAlgo_t algo{};
  bool known = false;
  {
    std::lock_guard<std::mutex> lock(cache_mutex());
    if (auto it = cache().find(p); it != cache().end()) {
      known = true;
      ++it->second.record.calls;
      chosen = it->second.record.chosen;
      algo = it->second.algo;
    }
  }
  if (!known) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    VLATUNE_CUDA_CHECK(cudaStreamIsCapturing(ctx.stream, &capture));
    if (capture != cudaStreamCaptureStatusNone) {  // no synchronization inside a capture: the baseline, uncached
      baseline.run(baseline.ctx);
      return;
    }
    Entry tuned = tune(p, ptr, ctx, baseline);  // the lock is not held while the stream is synchronized
    std::lock_guard<std::mutex> lock(cache_mutex());
    // Another thread may have tuned the same problem meanwhile: the first entry stays, so that every call of a
    // problem runs one algorithm.
    auto& kept = cache().try_emplace(p, std::move(tuned)).first->second;
    ++kept.record.calls;
    chosen = kept.record.chosen;
    algo = kept.algo;
  }
  if (chosen < 0) {
    baseline.run(baseline.ctx);
    return;
  }
  LtDescs d;
  if (const cublasStatus_t s = d.init(p, ptr.bias); s != CUBLAS_STATUS_SUCCESS) fail("descriptor set-up", s, p);
  if (const cublasStatus_t s = lt_matmul(ctx, d, ptr, algo); s != CUBLAS_STATUS_SUCCESS) fail("cublasLtMatmul", s, p);
}

std::vector<GemmTuneRecord> gemm_lt_records() {
  std::lock_guard<std::mutex> lock(cache_mutex());
  std::vector<GemmTuneRecord> out;
  out.reserve(cache().size());
  for (const auto& [problem, entry] : cache()) out.push_back(entry.record);
  return out;
}

void gemm_lt_clear() {
  std::lock_guard<std::mutex> lock(cache_mutex());
  cache().clear();
}

#else  // CPU-only build: nothing is ever tuned

std::vector<GemmTuneRecord> gemm_lt_records() {
  return {};
}

void gemm_lt_clear() {}

#endif  // VLATUNE_HAVE_CUDA

}  // namespace vlatune::kernels
