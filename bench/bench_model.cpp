// Pi0.5 full size, one training forward + backward (no optimizer) at the benchmark setting of the brief:
// 3 camera slots of which 2 are real (the empty one is pruned), prompts of 20..199 real tokens padded to 200,
// 50-step chunks, bf16 parameters and activations, the exact shortcuts on. Variants: what is recomputed.
// GPU time from CUDA events; peak memory from the caching allocator (counter peak_GiB); samples/s counter.
#ifdef VLATUNE_HAVE_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <memory>

#include "bench/gpu_timing.h"
#include "model/pi05.h"

namespace {

using vlatune::model::Pi05;

#ifdef VLATUNE_HAVE_CUDA
// One model for every case (3.35 B parameters take ~7 GiB in bf16 and a while to initialize).
Pi05& full_model() {
  static std::unique_ptr<Pi05> net = [] {
    auto m = std::make_unique<Pi05>(vlatune::model::Pi05Config::full(), torch::kCUDA, torch::kBFloat16);
    vlatune::model::init_weights(**m, 0);
    (*m)->pack_merged_weights();  // as the trainer: merged GEMMs read their packed weights, no per-step at::cat
    return m;
  }();
  return *net;
}

std::vector<std::string> vision_layer_fqns(const vlatune::model::Pi05Config& cfg) {
  std::vector<std::string> out;
  for (int64_t i = 0; i < cfg.vision.depth; ++i)
    out.push_back("paligemma_with_expert.paligemma.model.vision_tower.vision_model.encoder.layers." +
                  std::to_string(i));
  return out;
}
#endif

// range(0): batch; range(1): 0 = nothing recomputed, 1 = every SigLIP layer recomputed (the setting of the
// reference's SDPA and compiled runs, so the two compare directly); range(2): 1 = fused kernels and merged GEMMs
// (ForwardOptions::kernels kAuto, the default), 0 = the unfused reference modules.
void BM_pi05_step_fwd_bwd_bf16(benchmark::State& state) {
  if (!vlatune::bench::require_cuda(state)) return;
#ifdef VLATUNE_HAVE_CUDA
  const int64_t batch = state.range(0);
  Pi05& net = full_model();
  const auto& cfg = net->config();
  net->set_recompute(state.range(1) == 1 ? vision_layer_fqns(cfg) : std::vector<std::string>{});
  torch::Generator gen = at::detail::createCPUGenerator(1);
  auto b = vlatune::model::make_random_batch(cfg, batch, 3, 2, 200, 20, 199, 50, &gen, torch::kCUDA);
  vlatune::model::ForwardOptions options;
  options.kernels = state.range(2) == 1 ? vlatune::model::Kernels::kAuto : vlatune::model::Kernels::kReference;
  auto step = [&] {
    auto out = net->forward(b, options);
    out.loss.backward();
    net->fill_missing_grads();
    for (auto& p : net->parameters()) p.mutable_grad() = torch::Tensor();  // zero_grad(set_to_none)
  };
  c10::cuda::CUDACachingAllocator::resetPeakStats(0);
  vlatune::bench::run_gpu_timed(state, step);
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(0);
  const auto peak = stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak;
  state.counters["peak_GiB"] = static_cast<double>(peak) / (1ull << 30);
  state.counters["samples/s"] =
      benchmark::Counter(static_cast<double>(batch), benchmark::Counter::kIsIterationInvariantRate);
  net->set_recompute({});
#endif
}
BENCHMARK(BM_pi05_step_fwd_bwd_bf16)
    ->ArgNames({"batch", "recompute_vit", "fused"})
    ->Args({32, 1, 1})
    ->Args({32, 1, 0})
    ->Args({32, 0, 1})
    ->Iterations(3)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
