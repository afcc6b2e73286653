// GPU timing shared by the benchmarks: CUDA events around the body on the current stream, reported to Google
// Benchmark as manual time (its user guide's "Manual Timing"); host clocks overstate short GPU work.
#pragma once

#include <benchmark/benchmark.h>
#include <torch/torch.h>
#ifdef VLATUNE_HAVE_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace vlatune::bench {

// False (and the case marked skipped) when no GPU is visible.
inline bool require_cuda(benchmark::State& state) {
  if (torch::cuda::is_available()) return true;
  state.SkipWithError("no CUDA device");
  return false;
}

#ifdef VLATUNE_HAVE_CUDA
// Runs `body` once untimed (allocator growth, library heuristics), then times every iteration with CUDA events.
template <typename Body>
void run_gpu_timed(benchmark::State& state, Body&& body) {
  at::cuda::CUDAEvent start(cudaEventDefault), stop(cudaEventDefault);
  body();
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

}  // namespace vlatune::bench
