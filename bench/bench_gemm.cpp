// The ceilings every other number is read against: dense bf16 GEMM TFLOP/s and device copy GB/s, measured
// in the same run (H200.md: use measured ceilings, not datasheet ones). GPU time from CUDA events.
// BM_gemm_tuned: Pi0.5's largest GEMMs through kernels/gemm_tuned.h, tuned (the fastest of ATen and cuBLASLt's
// heuristic candidates, chosen on the untimed first call) against ATen (tuning off):
//   vlatune_bench --benchmark_filter=BM_gemm_tuned --benchmark_repetitions=5
#include <iterator>

#include "bench/gpu_timing.h"
#include "kernels/gemm_tuned.h"

namespace {

using vlatune::bench::require_cuda;
#ifdef VLATUNE_HAVE_CUDA
using vlatune::bench::run_gpu_timed;
#endif

void BM_gemm_bf16(benchmark::State& state) {
  if (!require_cuda(state)) return;
#ifdef VLATUNE_HAVE_CUDA
  const int64_t m = state.range(0), k = state.range(1), n = state.range(2);
  auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  auto a = torch::randn({m, k}, opts), b = torch::randn({k, n}, opts);
  run_gpu_timed(state, [&] { (void)torch::mm(a, b); });
  state.counters["TFLOP/s"] =
      benchmark::Counter(2.0 * m * k * n * 1e-12, benchmark::Counter::kIsIterationInvariantRate);
#endif
}
BENCHMARK(BM_gemm_bf16)
    ->ArgNames({"m", "k", "n"})
    ->Args({8192, 8192, 8192})
    ->Args({32 * 712, 2048, 16384})  // Pi0.5 backbone gate/up at batch 32, 712 prefix tokens
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

void BM_copy_device(benchmark::State& state) {
  if (!require_cuda(state)) return;
#ifdef VLATUNE_HAVE_CUDA
  const int64_t bytes = state.range(0) << 20;
  auto src = torch::empty({bytes}, torch::TensorOptions().device(torch::kCUDA).dtype(torch::kUInt8));
  auto dst = torch::empty_like(src);
  run_gpu_timed(state, [&] { dst.copy_(src); });
  state.counters["GB/s"] =
      benchmark::Counter(2.0 * bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);  // read + write
#endif
}
BENCHMARK(BM_copy_device)->ArgNames({"MiB"})->Arg(2048)->UseManualTime()->Unit(benchmark::kMillisecond);

// The problems of scripts/dev/gemm_algos.cu (torch Linear y = x W^T, x [rows, in], W [out, in]) at batch 32: the
// decoder at 712 prefix tokens per sample, SigLIP at 2 images x 256 tokens, with SigLIP's biases (forward: bias
// epilogue; wgrad: bias gradient, fused into the GEMM when a cuBLASLt candidate is kept, else a separate sum).
enum class GemmKind { kFwd, kDgrad, kWgrad };
struct GemmCase {
  const char* name;
  int64_t rows, in, out;
  GemmKind kind;
  bool bias;
};
constexpr int64_t kDecoderRows = 32 * 712, kVitRows = 32 * 2 * 256;
const GemmCase kGemmCases[] = {
    {"down_proj fwd", kDecoderRows, 16384, 2048, GemmKind::kFwd, false},
    {"down_proj dgrad", kDecoderRows, 16384, 2048, GemmKind::kDgrad, false},
    {"down_proj wgrad", kDecoderRows, 16384, 2048, GemmKind::kWgrad, false},
    {"gate_up fwd", kDecoderRows, 2048, 32768, GemmKind::kFwd, false},
    {"gate_up dgrad", kDecoderRows, 2048, 32768, GemmKind::kDgrad, false},
    {"gate_up wgrad", kDecoderRows, 2048, 32768, GemmKind::kWgrad, false},
    {"o_proj fwd", kDecoderRows, 2048, 2048, GemmKind::kFwd, false},
    {"qkv fwd", kDecoderRows, 2048, 2560, GemmKind::kFwd, false},
    {"siglip fc1 fwd", kVitRows, 1152, 4304, GemmKind::kFwd, true},
    {"siglip fc1 wgrad", kVitRows, 1152, 4304, GemmKind::kWgrad, true},
    {"siglip fc2 fwd", kVitRows, 4304, 1152, GemmKind::kFwd, true},
    {"siglip fc2 dgrad", kVitRows, 4304, 1152, GemmKind::kDgrad, true},
    {"siglip fc2 wgrad", kVitRows, 4304, 1152, GemmKind::kWgrad, true},
};

void BM_gemm_tuned(benchmark::State& state) {
  if (!require_cuda(state)) return;
#ifdef VLATUNE_HAVE_CUDA
  namespace k = vlatune::kernels;
  const GemmCase& c = kGemmCases[state.range(0)];
  const bool tuned = state.range(1) != 0;
  state.SetLabel(c.name);
  const bool was_on = k::gemm_tuning_enabled();
  k::set_gemm_tuning(tuned);
  auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  auto x = torch::randn({c.rows, c.in}, opts), w = torch::randn({c.out, c.in}, opts) * 0.02;
  auto g = torch::randn({c.rows, c.out}, opts), b = torch::randn({c.out}, opts);
  switch (c.kind) {
    case GemmKind::kFwd:
      run_gpu_timed(state, [&] { (void)k::tuned_mm(x, w.t(), c.bias ? b : torch::Tensor()); });
      break;
    case GemmKind::kDgrad:
      run_gpu_timed(state, [&] { (void)k::tuned_mm(g, w); });
      break;
    case GemmKind::kWgrad:
      if (c.bias)
        run_gpu_timed(state, [&] { (void)k::tuned_mm_row_sums(g.t(), x); });
      else
        run_gpu_timed(state, [&] { (void)k::tuned_mm(g.t(), x); });
      break;
  }
  k::set_gemm_tuning(was_on);
  state.counters["TFLOP/s"] =
      benchmark::Counter(2.0 * c.rows * c.in * c.out * 1e-12, benchmark::Counter::kIsIterationInvariantRate);
  if (!tuned) return;
  // What the tuner kept for this problem (cuBLAS sizes: fwd m = out, n = rows, k = in; dgrad m = in, n = rows,
  // k = out; wgrad m = in, n = out, k = rows): lt = 1 when a cuBLASLt candidate beat ATen's GEMM.
  const int64_t m = c.kind == GemmKind::kFwd ? c.out : c.in;
  const int64_t n = c.kind == GemmKind::kWgrad ? c.out : c.rows;
  const int64_t kk = c.kind == GemmKind::kFwd ? c.in : c.kind == GemmKind::kDgrad ? c.out : c.rows;
  for (const auto& r : k::gemm_tuning_records()) {
    if (r.problem.m != m || r.problem.n != n || r.problem.k != kk) continue;
    if ((r.problem.epilogue != k::GemmEpilogue::kNone) != (c.bias && c.kind != GemmKind::kDgrad)) continue;
    state.counters["lt"] = r.chosen >= 0 ? 1 : 0;
    state.counters["aten_ms"] = r.baseline_ms;
    state.counters["kept_ms"] = r.chosen_ms;
  }
#endif
}
BENCHMARK(BM_gemm_tuned)
    ->ArgNames({"case", "tuned"})
    ->Apply([](benchmark::internal::Benchmark* b) {
      for (int64_t c = 0; c < static_cast<int64_t>(std::size(kGemmCases)); ++c) b->Args({c, 0})->Args({c, 1});
    })
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
