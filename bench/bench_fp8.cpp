// The FP8 Linear (model/float8_linear.h: fused quantization + three at::_scaled_mm GEMMs) against the bf16 Linear,
// forward + backward (dx and dW), at Pi0.5's shapes for batch 32 (anchors.md §4.3: M = 24,384 prefix tokens, 1,600
// expert tokens). Arg `mode`: 0 = bf16 (at::linear through autograd), 1 = FP8 current scaling, 2 = FP8 delayed.
//   vlatune_bench --benchmark_filter='fp8' --benchmark_repetitions=5
#include <vector>

#include "bench/gpu_timing.h"
#include "model/float8_linear.h"

namespace {

using vlatune::bench::require_cuda;

void BM_fp8_linear_fwd_bwd(benchmark::State& state) {
  if (!require_cuda(state)) return;
#ifdef VLATUNE_HAVE_CUDA
  const int64_t m = state.range(0), k = state.range(1), n = state.range(2), mode = state.range(3);
  const auto opt = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  auto x = torch::randn({m, k}, opt).requires_grad_(true);
  auto w = (torch::randn({n, k}, opt) / 32).requires_grad_(true);
  auto seed = torch::randn({m, n}, opt);
  vlatune::model::Float8State st;
  st.config.scaling = mode == 2 ? vlatune::model::Fp8Scaling::kDelayed : vlatune::model::Fp8Scaling::kCurrent;
  vlatune::bench::run_gpu_timed(state, [&] {
    auto y = mode == 0 ? at::linear(x, w) : vlatune::model::float8_linear(x, {w}, {}, st);
    (void)torch::autograd::grad({y}, {x, w}, {seed});
  });
  state.counters["TFLOP/s"] =
      benchmark::Counter(6.0 * m * k * n * 1e-12, benchmark::Counter::kIsIterationInvariantRate);
#endif
}

void shapes(benchmark::internal::Benchmark* b) {
  const std::vector<std::vector<int64_t>> mkn = {
      {24384, 2048, 32768},  // VLM gate+up (merged)
      {24384, 16384, 2048},  // VLM down
      {24384, 2048, 2560},   // VLM q+k+v (merged)
      {24384, 2048, 2048},   // VLM o
      {1600, 1024, 8192},    // expert gate+up (merged)
      {1600, 4096, 1024},    // expert down
      {1600, 1024, 2560},    // expert q+k+v (merged)
      {1600, 2048, 1024},    // expert o
  };
  for (const auto& s : mkn)
    for (int64_t mode : {0, 1, 2}) b->Args({s[0], s[1], s[2], mode});
  b->ArgNames({"M", "K", "N", "mode"});
}

}  // namespace

BENCHMARK(BM_fp8_linear_fwd_bwd)->Apply(shapes)->UseManualTime()->Unit(benchmark::kMillisecond);
