// GEMM inventory timing: the three GEMMs of a Linear (forward y = x W^T, input gradient dx = dy W, weight
// gradient dW = dy^T x) at its real (m, k, n), in bf16 and in FP8 tensorwise (e4m3 activations and weights,
// e5m2 gradients, through kernels::fp8_mm as the FP8 Linear calls it: fast accumulation in the forward, timed
// cuBLASLt algorithms), plus the quantization the FP8 path needs
// (amax, scale, cast, transposed copies) as the trainer runs it. Medians of CUDA-event timings with L2 flushed
// before each repetition (cold L2, as in a training step; host clocks overstate small GEMMs).
#pragma once

#include <cstdint>
#include <optional>

#include "formats/profile.h"

namespace vlatune::profiler {

struct GemmTiming {
  formats::GemmTimes bf16;
  std::optional<formats::GemmTimes> fp8;  // nullopt: a dimension not divisible by 16, or no FP8 support
  std::optional<double> quant_ms;
};

// Needs a CUDA device (throws std::runtime_error otherwise).
GemmTiming time_gemm(int64_t m, int64_t k, int64_t n, int repetitions);

}  // namespace vlatune::profiler
