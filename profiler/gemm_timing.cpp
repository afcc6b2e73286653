#include "profiler/gemm_timing.h"

#include <ATen/ATen.h>

#include "formats/numbers.h"
#include "kernels/device_probe.h"
#include "kernels/fp8_ops.h"

#include <algorithm>
#include <stdexcept>
#include <vector>

#ifdef VLATUNE_HAVE_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace vlatune::profiler {

#ifdef VLATUNE_HAVE_CUDA
namespace {

// Median ms of `body` over `reps` runs, each after overwriting a buffer larger than the H200's 50 MB L2.
template <typename Body>
double time_cold(const at::Tensor& flush, int reps, Body&& body) {
  body();  // warm-up: cuBLAS heuristics, allocator
  at::cuda::CUDAEvent start(cudaEventDefault), stop(cudaEventDefault);
  std::vector<double> ms;
  for (int r = 0; r < reps; ++r) {
    flush.fill_(r);
    auto stream = c10::cuda::getCurrentCUDAStream();
    start.record(stream);
    body();
    stop.record(stream);
    stop.synchronize();
    ms.push_back(start.elapsed_time(stop));
  }
  return formats::median(ms);
}

// Tensorwise quantization as the trainer's unfused path runs it: amax, scale = fp8_max / amax, scaled cast.
std::pair<at::Tensor, at::Tensor> quantize(const at::Tensor& x, at::ScalarType fp8, double fp8_max) {
  auto amax = x.abs().amax().to(at::kFloat).clamp_min(1e-12);
  auto scale = fp8_max / amax;
  auto q = (x.to(at::kFloat) * scale).clamp(-fp8_max, fp8_max).to(fp8);
  return {q, scale.reciprocal()};
}

}  // namespace

GemmTiming time_gemm(int64_t m, int64_t k, int64_t n, int repetitions) {
  if (!at::hasCUDA()) throw std::runtime_error("GEMM timing needs a CUDA device");
  const auto bf16 = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  at::Tensor flush = at::empty({int64_t{256} << 20}, at::TensorOptions().device(at::kCUDA).dtype(at::kByte));
  at::Tensor x = at::randn({m, k}, bf16), w = at::randn({n, k}, bf16), dy = at::randn({m, n}, bf16);
  GemmTiming t;
  t.bf16.forward_ms = time_cold(flush, repetitions, [&] { at::mm(x, w.t()); });
  t.bf16.grad_input_ms = time_cold(flush, repetitions, [&] { at::mm(dy, w); });
  t.bf16.grad_weight_ms = time_cold(flush, repetitions, [&] { at::mm(dy.t(), x); });

  // FP8 GEMMs need compute capability 8.9: without them the entry has no FP8 times, so the planner never picks FP8.
  const bool fp8_hardware = kernels::fp8_supported(kernels::device_compute_capability(c10::cuda::current_device()));
  if (fp8_hardware && m % 16 == 0 && k % 16 == 0 && n % 16 == 0) {
    constexpr double kE4m3Max = 448.0, kE5m2Max = 57344.0;
    auto [xq, xs] = quantize(x, at::kFloat8_e4m3fn, kE4m3Max);
    auto [wq, ws] = quantize(w, at::kFloat8_e4m3fn, kE4m3Max);
    auto [gq, gs] = quantize(dy, at::kFloat8_e5m2, kE5m2Max);
    // As the FP8 Linear runs them (model/float8_linear.cpp): fast accumulation in the forward only, and the
    // cuBLASLt algorithm `vlatune plan` writes with every FP8 selection (fp8.gemm_algorithm "timed"; its first-call
    // timing falls in time_cold's warm-up). A row-major, B column-major: B = W^T is W's transpose view for the
    // forward; the gradients need transposed copies (W^T row-major for dx, dy^T and x^T row-major for dW).
    constexpr auto kAlgorithm = kernels::Fp8GemmAlgorithm::kTimed;
    at::Tensor wt = wq.t().contiguous(), gt = gq.t().contiguous(), xt = xq.t().contiguous();
    formats::GemmTimes f;
    f.forward_ms = time_cold(flush, repetitions,
                             [&] { kernels::fp8_mm(xq, wq.t(), xs, ws, at::kBFloat16, true, {}, kAlgorithm); });
    f.grad_input_ms = time_cold(flush, repetitions,
                                [&] { kernels::fp8_mm(gq, wt.t(), gs, ws, at::kBFloat16, false, {}, kAlgorithm); });
    f.grad_weight_ms = time_cold(flush, repetitions,
                                 [&] { kernels::fp8_mm(gt, xt.t(), gs, xs, at::kBFloat16, false, {}, kAlgorithm); });
    t.fp8 = f;
    // The casts as the trainer's FP8 Linear runs them (model/float8_linear.h, delayed scaling): x and dy in one
    // fused pass each (row-major + transposed copy, scale from the amax history, this amax recorded); the weight:
    // an amax pass + the row-major cast (forward) and the transposed cast with that amax (backward).
    const auto f32 = at::TensorOptions().device(at::kCUDA).dtype(at::kFloat);
    at::Tensor history = at::full({16}, 4.0f, f32), w_amax = at::zeros({1}, f32), inv = at::empty({}, f32);
    at::Tensor x_rm = at::empty_like(xq), x_t = at::empty_like(xt), w_rm = at::empty_like(wq), w_t = at::empty_like(wt);
    at::Tensor g_rm = at::empty_like(gq), g_t = at::empty_like(gt);
    t.quant_ms = time_cold(flush, repetitions, [&] {
      kernels::Fp8QuantOutputs ox{x_rm, x_t, history.narrow(0, 0, 1), inv, {}};
      kernels::fp8_quantize_into(x, kernels::Fp8Format::kE4m3, history, 0, ox);
      w_amax.zero_();
      kernels::fp8_amax_into(w, w_amax);
      kernels::fp8_quantize_into(w, kernels::Fp8Format::kE4m3, w_amax, -1, {w_rm, {}, {}, inv, {}});
      kernels::fp8_quantize_into(w, kernels::Fp8Format::kE4m3, w_amax, -1, {{}, w_t, {}, inv, {}});
      kernels::Fp8QuantOutputs og{g_rm, g_t, history.narrow(0, 1, 1), inv, {}};
      kernels::fp8_quantize_into(dy, kernels::Fp8Format::kE5m2, history, 1, og);
    });
  }
  return t;
}

#else

GemmTiming time_gemm(int64_t, int64_t, int64_t, int) {
  throw std::runtime_error("GEMM timing needs a CUDA build");
}

#endif

}  // namespace vlatune::profiler
