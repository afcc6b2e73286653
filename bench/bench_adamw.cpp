// The optimizer step over a Pi0.5-shaped parameter list (~3.35e9 bf16 elements; div=4 divides every tensor's
// first dimension by 4): vlatune's fused multi-tensor AdamW against the ATen reference (per-tensor ops, the CPU
// path run on the GPU) and torch's own fused kernel (at::_fused_adamw_, what torch.optim.AdamW(fused=True) runs),
// plus the fused global norm. bf16 parameters, gradients and state ("bf16" precision). GPU time from CUDA events.
// The 8-bit-state kernel (adamw_step_int8) on the same list.
//   vlatune_bench --benchmark_filter='adamw|grad_norm' --benchmark_repetitions=10 --benchmark_format=json
#include <vector>

#include "bench/gpu_timing.h"
#include "kernels/adamw_ops.h"

namespace {

using vlatune::bench::require_cuda;
#ifdef VLATUNE_HAVE_CUDA
using vlatune::bench::run_gpu_timed;

// Pi0.5's trainable parameters (openpi: everything trains): SigLIP So400m/14 (27 layers), the projector,
// Gemma 2B (18 layers, with the 257152-token embedding), the Gemma 300M action expert with adaRMS, the heads.
std::vector<std::vector<int64_t>> pi05_param_shapes(int64_t div) {
  std::vector<std::vector<int64_t>> s;
  auto lin = [&](int64_t out, int64_t in, bool bias) {
    s.push_back({out / div, in});
    if (bias) s.push_back({out / div});
  };
  auto vec = [&](int64_t n) { s.push_back({n / div}); };
  // SigLIP.
  s.push_back({1152 / div, 3, 14, 14});
  vec(1152);
  s.push_back({256 / div, 1152});
  for (int l = 0; l < 27; ++l) {
    for (int k = 0; k < 4; ++k) lin(1152, 1152, true);  // q, k, v, out
    vec(1152), vec(1152), vec(1152), vec(1152);         // layer norms 1, 2
    lin(4304, 1152, true);
    lin(1152, 4304, true);
  }
  vec(1152), vec(1152);
  lin(2048, 1152, true);  // multi_modal_projector
  // Gemma 2B.
  s.push_back({257152 / div, 2048});
  for (int l = 0; l < 18; ++l) {
    lin(2048, 2048, false), lin(256, 2048, false), lin(256, 2048, false), lin(2048, 2048, false);
    lin(16384, 2048, false), lin(16384, 2048, false), lin(2048, 16384, false);
    vec(2048), vec(2048);
  }
  vec(2048);
  // Gemma 300M expert, adaRMS norms (dense 1024 -> 3 x 1024).
  for (int l = 0; l < 18; ++l) {
    lin(2048, 1024, false), lin(256, 1024, false), lin(256, 1024, false), lin(1024, 2048, false);
    lin(4096, 1024, false), lin(4096, 1024, false), lin(1024, 4096, false);
    lin(3072, 1024, true), lin(3072, 1024, true);
  }
  lin(3072, 1024, true);
  // Heads.
  lin(1024, 32, true), lin(32, 1024, true), lin(1024, 1024, true), lin(1024, 1024, true);
  return s;
}

struct Lists {
  std::vector<torch::Tensor> p, g, m, v;
  int64_t elements = 0;
};

Lists make_lists(int64_t div) {
  Lists l;
  const auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  for (const auto& shape : pi05_param_shapes(div)) {
    l.p.push_back(torch::randn(shape, opts));
    l.g.push_back(torch::randn(shape, opts) * 1e-3);
    l.m.push_back(torch::zeros(shape, opts));
    l.v.push_back(torch::zeros(shape, opts));
    l.elements += l.p.back().numel();
  }
  return l;
}

vlatune::kernels::AdamwParams pi05_params() {
  vlatune::kernels::AdamwParams hp;
  hp.lr = 5e-5;
  hp.step = 10;
  return hp;
}

void set_counters(benchmark::State& state, const Lists& l) {
  // Per element: read p, g, m, v and write p, m, v, 2 bytes each.
  state.counters["GB/s"] = benchmark::Counter(14.0 * l.elements * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["Gelem"] = static_cast<double>(l.elements) * 1e-9;
  state.counters["tensors"] = static_cast<double>(l.p.size());
}
#endif

void BM_adamw_step_fused(benchmark::State& state) {
  if (!require_cuda(state)) return;
#ifdef VLATUNE_HAVE_CUDA
  Lists l = make_lists(state.range(0));
  const torch::Tensor scale = torch::ones({}, torch::TensorOptions().device(torch::kCUDA));
  const auto hp = pi05_params();
  run_gpu_timed(state, [&] { vlatune::kernels::adamw_step(l.p, l.g, l.m, l.v, nullptr, hp, scale); });
  set_counters(state, l);
#endif
}

// 8-bit state (optimizer.state_dtype "int8-blockwise"): uint8 codes and an fp32 absmax per 256 elements.
void BM_adamw_step_int8_fused(benchmark::State& state) {
  if (!require_cuda(state)) return;
#ifdef VLATUNE_HAVE_CUDA
  Lists l = make_lists(state.range(0));
  vlatune::kernels::AdamwInt8State s;
  const auto& maps = vlatune::kernels::adamw_quant_maps();
  for (const torch::Tensor& p : l.p) {
    const auto opts = p.options();
    const int64_t blocks = vlatune::kernels::adamw_quant_blocks(p.numel());
    s.exp_avg.push_back(torch::full_like(p, maps.exp_avg_zero, opts.dtype(torch::kUInt8)));
    s.exp_avg_sq.push_back(torch::full_like(p, maps.exp_avg_sq_zero, opts.dtype(torch::kUInt8)));
    s.exp_avg_absmax.push_back(torch::zeros({blocks}, opts.dtype(torch::kFloat32)));
    s.exp_avg_sq_absmax.push_back(torch::zeros({blocks}, opts.dtype(torch::kFloat32)));
  }
  l.m.clear(), l.v.clear();
  const torch::Tensor scale = torch::ones({}, torch::TensorOptions().device(torch::kCUDA));
  const auto hp = pi05_params();
  run_gpu_timed(state, [&] { vlatune::kernels::adamw_step_int8(l.p, l.g, s, nullptr, hp, scale); });
  set_counters(state, l);
  // Per element: read p, g (2 B each) and two codes, write p and two codes; 16 B of absmax per 256 elements.
  state.counters["GB/s"] =
      benchmark::Counter((10.0 + 16.0 / 256) * l.elements * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
#endif
}

void BM_adamw_step_aten(benchmark::State& state) {
  if (!require_cuda(state)) return;
#ifdef VLATUNE_HAVE_CUDA
  torch::NoGradGuard no_grad;
  Lists l = make_lists(state.range(0));
  const auto hp = pi05_params();
  run_gpu_timed(state, [&] { vlatune::kernels::adamw_step_ref(l.p, l.g, l.m, l.v, nullptr, hp); });
  set_counters(state, l);
#endif
}

void BM_adamw_step_torch_fused(benchmark::State& state) {
  if (!require_cuda(state)) return;
#ifdef VLATUNE_HAVE_CUDA
  torch::NoGradGuard no_grad;
  Lists l = make_lists(state.range(0));
  std::vector<torch::Tensor> steps;
  for (size_t i = 0; i < l.p.size(); ++i) steps.push_back(torch::full({}, 10.0f, torch::kCUDA));
  const auto hp = pi05_params();
  run_gpu_timed(state, [&] {
    at::_fused_adamw_(l.p, l.g, l.m, l.v, {}, steps, hp.lr, hp.beta1, hp.beta2, hp.weight_decay, hp.eps,
                      /*amsgrad=*/false, /*maximize=*/false);
  });
  set_counters(state, l);
#endif
}

void BM_grad_norm_fused(benchmark::State& state) {
  if (!require_cuda(state)) return;
#ifdef VLATUNE_HAVE_CUDA
  Lists l = make_lists(state.range(0));
  l.p.clear(), l.m.clear(), l.v.clear();
  run_gpu_timed(state, [&] { (void)vlatune::kernels::global_grad_norm(l.g); });
  state.counters["GB/s"] = benchmark::Counter(2.0 * l.elements * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
#endif
}

}  // namespace

BENCHMARK(BM_adamw_step_fused)->ArgNames({"div"})->Arg(4)->Arg(1)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_adamw_step_int8_fused)->ArgNames({"div"})->Arg(4)->Arg(1)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_adamw_step_aten)->ArgNames({"div"})->Arg(4)->Arg(1)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_adamw_step_torch_fused)->ArgNames({"div"})->Arg(4)->Arg(1)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_grad_norm_fused)->ArgNames({"div"})->Arg(4)->Arg(1)->UseManualTime()->Unit(benchmark::kMillisecond);
