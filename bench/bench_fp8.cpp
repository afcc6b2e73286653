// The FP8 Linear (model/float8_linear.h: fused quantization + three at::_scaled_mm GEMMs) against the bf16 Linear,
// forward + backward (dx and dW), at Pi0.5's shapes for batch 32 (anchors.md §4.3: M = 24,384 prefix tokens, 1,600
// expert tokens). Arg `mode`: 0 = bf16 (at::linear through autograd), 1 = FP8 current scaling, 2 = FP8 delayed.
//   vlatune_bench --benchmark_filter='fp8' --benchmark_repetitions=5
#include <vector>

#include "bench/gpu_timing.h"
#include "kernels/fp8_ops.h"
#include "kernels/fused_ops.h"
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

// The GeGLU <-> FP8 boundary of the backbone MLP at batch 32 ([22,784, 2 x 16,384] merged), delayed scaling.
// Arg fused: 0 = the unfused sequence (geglu -> cast; geglu backward -> cast of d merged + cast of the rebuilt
// GeGLU output), 1 = the fused casts (kernels/fp8_ops.h fp8_geglu_*), 2 = the fused casts as the shipped FP8 recipe
// runs them (fp8.saved_geglu_inputs "e4m3-blocks": the forward writes the row-major copy and merged's e4m3 blocks,
// the backward reads the blocks). Bytes: the fused kernels' traffic.
void BM_fp8_geglu_cast(benchmark::State& state) {
  if (!require_cuda(state)) return;
#ifdef VLATUNE_HAVE_CUDA
  namespace k = vlatune::kernels;
  const int64_t rows = state.range(0), f = state.range(1);
  const bool fused = state.range(2) != 0, blocks = state.range(2) == 2;
  const auto opt = torch::TensorOptions().device(torch::kCUDA);
  auto merged = torch::randn({rows, 2 * f}, opt.dtype(torch::kBFloat16));
  auto grad = (torch::randn({rows, f}, opt) * 1e-3).to(torch::kBFloat16);
  auto hist = torch::full({16}, 4.0f, opt.dtype(torch::kFloat32));
  auto act_amax = torch::full({1}, 4.0f, opt.dtype(torch::kFloat32));
  const auto e4 = opt.dtype(torch::kFloat8_e4m3fn), e5 = opt.dtype(torch::kFloat8_e5m2);
  k::Fp8QuantOutputs fwd;
  fwd.out = torch::empty({rows, f}, e4);
  fwd.out_t = torch::empty({f, rows}, e4);
  fwd.inv_scale = torch::empty({}, opt.dtype(torch::kFloat32));
  fwd.amax_out = torch::zeros({1}, opt.dtype(torch::kFloat32));
  if (blocks) fwd.out_t = torch::Tensor();
  const k::GegluBlocks merged_blocks = blocks ? k::geglu_blocks_like(merged) : k::GegluBlocks();
  k::Fp8GegluGradOutputs bwd;
  bwd.grad_merged.out = torch::empty({rows, 2 * f}, e5);
  bwd.grad_merged.out_t = torch::empty({2 * f, rows}, e5);
  bwd.grad_merged.inv_scale = torch::empty({}, opt.dtype(torch::kFloat32));
  bwd.grad_merged.amax_out = torch::zeros({1}, opt.dtype(torch::kFloat32));
  bwd.act_t = torch::empty({f, rows}, e4);
  bwd.act_inv_scale = torch::empty({}, opt.dtype(torch::kFloat32));
  vlatune::bench::run_gpu_timed(state, [&] {
    if (fused) {
      k::fp8_geglu_quantize_into(merged, hist, 0, fwd, merged_blocks);
      k::fp8_geglu_backward_quantize_into(grad, blocks ? torch::Tensor() : merged, k::Fp8Format::kE5m2, hist, 0,
                                          act_amax, bwd, merged_blocks);
    } else {
      k::fp8_quantize_into(k::geglu(merged), k::Fp8Format::kE4m3, hist, 0, fwd);
      k::fp8_quantize_into(k::geglu_backward(grad, merged), k::Fp8Format::kE5m2, hist, 0, bwd.grad_merged);
      k::Fp8QuantOutputs a;
      a.out_t = bwd.act_t;
      a.inv_scale = bwd.act_inv_scale;
      k::fp8_quantize_into(k::geglu(merged), k::Fp8Format::kE4m3, act_amax, -1, a);
    }
  });
  // Fused traffic: forward reads merged (4F B/row) and writes 2 x F; backward reads merged + grad (6F) and writes
  // 2 x 2F + F. With blocks: the forward writes F + the blocks (2F (1 + 4/64)), the backward reads them instead of
  // merged.
  const double block_bytes = 2 * (1 + 4.0 / 64);
  const double bytes =
      static_cast<double>(rows) * f * (blocks ? 4 + 1 + block_bytes + block_bytes + 2 + 5 : 4 + 2 + 6 + 5);
  state.counters["GB/s"] = benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
#endif
}

// The GELU -> FP8 boundary of SigLIP's fc2 at batch 32 ([16,384, 4,304], two images per sample), delayed scaling:
// the forward cast of fc2's input. Arg fused: 0 = the GELU kernel, then the plain cast; 1 = the cast kernel that
// computes the GELU (kernels/fp8_ops.h fp8_gelu_quantize_into). Bytes: the fused kernel's traffic.
void BM_fp8_gelu_cast(benchmark::State& state) {
  if (!require_cuda(state)) return;
#ifdef VLATUNE_HAVE_CUDA
  namespace k = vlatune::kernels;
  const int64_t rows = state.range(0), f = state.range(1);
  const bool fused = state.range(2) != 0;
  const auto opt = torch::TensorOptions().device(torch::kCUDA);
  auto pre = torch::randn({rows, f}, opt.dtype(torch::kBFloat16));
  auto hist = torch::full({16}, 4.0f, opt.dtype(torch::kFloat32));
  k::Fp8QuantOutputs o;
  o.out = torch::empty({rows, f}, opt.dtype(torch::kFloat8_e4m3fn));
  o.inv_scale = torch::empty({}, opt.dtype(torch::kFloat32));
  o.amax_out = torch::zeros({1}, opt.dtype(torch::kFloat32));
  vlatune::bench::run_gpu_timed(state, [&] {
    if (fused)
      k::fp8_gelu_quantize_into(pre, hist, 0, o);
    else
      k::fp8_quantize_into(k::gelu(pre), k::Fp8Format::kE4m3, hist, 0, o);
  });
  state.counters["GB/s"] =
      benchmark::Counter(static_cast<double>(rows) * f * 3 * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
#endif
}

// SigLIP's MLP tail, fc2(gelu(pre)) forward + backward (d pre, dW, db) at batch 32: mode 0 = bf16
// (kernels::gelu_linear), 1 = fc2 in FP8 with delayed scaling (model::float8_gelu_linear).
void BM_fp8_gelu_linear(benchmark::State& state) {
  if (!require_cuda(state)) return;
#ifdef VLATUNE_HAVE_CUDA
  const int64_t m = state.range(0), k = state.range(1), n = state.range(2), mode = state.range(3);
  const auto opt = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  auto pre = torch::randn({m, k}, opt).requires_grad_(true);
  auto w = (torch::randn({n, k}, opt) / 64).requires_grad_(true);
  auto b = torch::randn({n}, opt).requires_grad_(true);
  auto seed = torch::randn({m, n}, opt);
  vlatune::model::Float8State st;
  vlatune::bench::run_gpu_timed(state, [&] {
    auto y = mode == 0 ? vlatune::kernels::gelu_linear(pre, w, b, "")
                       : vlatune::model::float8_gelu_linear(pre, w, b, st, "");
    (void)torch::autograd::grad({y}, {pre, w, b}, {seed});
  });
  state.counters["TFLOP/s"] =
      benchmark::Counter(6.0 * m * k * n * 1e-12, benchmark::Counter::kIsIterationInvariantRate);
#endif
}

}  // namespace

BENCHMARK(BM_fp8_geglu_cast)
    ->Args({22784, 16384, 0})
    ->Args({22784, 16384, 1})
    ->Args({22784, 16384, 2})
    ->ArgNames({"rows", "F", "fused"})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_fp8_linear_fwd_bwd)->Apply(shapes)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_fp8_gelu_cast)
    ->Args({16384, 4304, 0})
    ->Args({16384, 4304, 1})
    ->ArgNames({"rows", "F", "fused"})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_fp8_gelu_linear)
    ->Args({16384, 4304, 1152, 0})
    ->Args({16384, 4304, 1152, 1})
    ->ArgNames({"M", "K", "N", "mode"})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
