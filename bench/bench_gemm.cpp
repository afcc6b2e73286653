// The ceilings every other number is read against: dense bf16 GEMM TFLOP/s and device copy GB/s, measured
// in the same run (H200.md: use measured ceilings, not datasheet ones). GPU time from CUDA events.
#include <benchmark/benchmark.h>
#include <torch/torch.h>
#ifdef VLATUNE_HAVE_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace {

#ifdef VLATUNE_HAVE_CUDA
// Times `body` with CUDA events on the current stream; reports GPU seconds to Google Benchmark.
template <typename Body>
void run_gpu_timed(benchmark::State& state, Body&& body) {
  at::cuda::CUDAEvent start(cudaEventDefault), stop(cudaEventDefault);
  body();  // warm-up (cuBLAS heuristics, allocator)
  torch::cuda::synchronize();
  for (auto _ : state) {
    auto stream = c10::cuda::getCurrentCUDAStream();
    start.record(stream);
    body();
    stop.record(stream);
    stop.synchronize();
    state.SetIterationTime(start.elapsed_time(stop) / 1e3);
  }
}
#endif

void BM_gemm_bf16(benchmark::State& state) {
  if (!torch::cuda::is_available()) {
    state.SkipWithError("no CUDA device");
    return;
  }
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
  if (!torch::cuda::is_available()) {
    state.SkipWithError("no CUDA device");
    return;
  }
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
