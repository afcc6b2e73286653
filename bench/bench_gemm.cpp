// The ceilings every other number is read against: dense bf16 GEMM TFLOP/s and device copy GB/s, measured
// in the same run (H200.md: use measured ceilings, not datasheet ones). GPU time from CUDA events.
#include "bench/gpu_timing.h"

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

}  // namespace
