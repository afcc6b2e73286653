// The ceilings every other number is read against: dense bf16 GEMM TFLOP/s and device copy GB/s, measured
// in the same run (H200.md: use measured ceilings, not datasheet ones). GPU time from CUDA events.
// BM_gemm_pi05: Pi0.5's largest GEMMs as the step runs them (ATen's cuBLAS GEMMs; a bias gradient by
// kernels::bias_grad): vlatune_bench --benchmark_filter=BM_gemm_pi05 --benchmark_repetitions=10
#include <iterator>

#include "bench/gpu_timing.h"
#include "kernels/fused_ops.h"

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
// decoder at 712 prefix tokens per sample, SigLIP at 2 images x 256 tokens, with SigLIP's biases (forward: addmm;
// wgrad: the weight GEMM and the bias gradient).
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

void BM_gemm_pi05(benchmark::State& state) {
  if (!require_cuda(state)) return;
#ifdef VLATUNE_HAVE_CUDA
  const GemmCase& c = kGemmCases[state.range(0)];
  state.SetLabel(c.name);
  auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  auto x = torch::randn({c.rows, c.in}, opts), w = torch::randn({c.out, c.in}, opts) * 0.02;
  auto g = torch::randn({c.rows, c.out}, opts), b = torch::randn({c.out}, opts);
  switch (c.kind) {
    case GemmKind::kFwd:
      run_gpu_timed(state, [&] { (void)(c.bias ? torch::addmm(b, x, w.t()) : torch::mm(x, w.t())); });
      break;
    case GemmKind::kDgrad:
      run_gpu_timed(state, [&] { (void)torch::mm(g, w); });
      break;
    case GemmKind::kWgrad:
      run_gpu_timed(state, [&] {
        (void)torch::mm(g.t(), x);
        if (c.bias) (void)vlatune::kernels::bias_grad(g, g.scalar_type());
      });
      break;
  }
  state.counters["TFLOP/s"] =
      benchmark::Counter(2.0 * c.rows * c.in * c.out * 1e-12, benchmark::Counter::kIsIterationInvariantRate);
#endif
}
BENCHMARK(BM_gemm_pi05)
    ->ArgNames({"case"})
    ->DenseRange(0, static_cast<int64_t>(std::size(kGemmCases)) - 1)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
