// The fused decoder kernels (kernels/fused_ops.h) against the unfused ATen sequences the model ran before
// (the *_ref functions, differentiated by autograd), at Pi0.5's shapes for batch 32 (2 images + a prompt trimmed
// to 208 tokens: P = 720 prefix tokens per sample, S = 50 action tokens). Arg `fused`: 1 = kernels, 0 = ATen.
// GB/s counts the fewest bytes the op must move (each input read once, each output written once) for both
// variants, so the two compare directly and against BM_copy_bf16 (read + write of a device-to-device copy, the
// H200's practical ceiling, measured in the same run).
//   vlatune_bench --benchmark_filter='fused|copy' --benchmark_repetitions=10
#include <functional>
#include <memory>
#include <vector>

#include "bench/gpu_timing.h"
#include "kernels/fused_ops.h"
#include "kernels/varlen_attention.h"

namespace {

namespace k = vlatune::kernels;
using vlatune::bench::require_cuda;

constexpr int64_t kBatch = 32, kPrefix = 720, kSuffix = 50;
constexpr int64_t kWidthPrefix = 2048, kWidthExpert = 1024, kMlp = 16384;
constexpr int64_t kHeads = 8, kKvHeads = 1, kHeadDim = 256;
constexpr int64_t kVitTokens = 256, kVitWidth = 1152, kVitMlp = 4304;  // SigLIP: 2 images per sample

#ifdef VLATUNE_HAVE_CUDA
using vlatune::bench::run_gpu_timed;

torch::Tensor rnd(std::vector<int64_t> shape, double scale = 1.0) {
  return (torch::randn(shape, torch::TensorOptions().device(torch::kCUDA)) * scale).to(torch::kBFloat16);
}

void set_bytes(benchmark::State& state, double bytes) {
  state.counters["GB/s"] = benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["MB"] = bytes * 1e-6;
}

// Forward and backward through autograd: outputs of fn(inputs) against seeds; gradients of every input.
template <typename Fn>
void fwd_bwd(Fn&& fn, const std::vector<torch::Tensor>& inputs, const std::vector<torch::Tensor>& seeds) {
  std::vector<torch::Tensor> outs = fn(inputs);
  std::vector<torch::Tensor> wrt;
  for (const auto& t : inputs)
    if (t.defined() && t.requires_grad()) wrt.push_back(t);
  (void)torch::autograd::grad(outs, wrt, seeds);
}

std::vector<torch::Tensor> leaves(std::vector<torch::Tensor> ts) {
  for (auto& t : ts)
    if (t.defined()) t.requires_grad_(true);
  return ts;
}
#endif

void BM_copy_bf16(benchmark::State& state) {
  if (!require_cuda(state)) return;
#ifdef VLATUNE_HAVE_CUDA
  const int64_t n = int64_t{1} << 29;  // 1 GiB of bf16
  auto src = rnd({n}), dst = torch::empty_like(src);
  run_gpu_timed(state, [&] { dst.copy_(src); });
  set_bytes(state, 2.0 * 2 * n);
#endif
}

// Prefix: h = x + attn; y = RMSNorm(h). rows = 32 * 720, width 2048.
void BM_fused_rms_norm_residual(benchmark::State& state) {
  if (!require_cuda(state)) return;
#ifdef VLATUNE_HAVE_CUDA
  const bool fused = state.range(0) == 1, backward = state.range(1) == 1;
  const int64_t rows = kBatch * kPrefix, w = kWidthPrefix;
  auto in = std::vector<torch::Tensor>{rnd({rows, w}, 3), rnd({rows, w}), rnd({w}, 0.1)};
  auto fn = [&](const std::vector<torch::Tensor>& x) {
    auto o = fused ? k::rms_norm_residual(x[0], x[1], x[2], 1e-6) : k::rms_norm_residual_ref(x[0], x[1], x[2], 1e-6);
    return std::vector<torch::Tensor>{o.h, o.y};
  };
  const double unit = 2.0 * rows * w;  // one bf16 activation tensor
  if (backward) {
    auto leaf = leaves(in);
    std::vector<torch::Tensor> seeds = {rnd({rows, w}), rnd({rows, w})};
    run_gpu_timed(state, [&] { fwd_bwd(fn, leaf, seeds); });
    set_bytes(state, 8 * unit);  // fwd: x, delta -> h, y; bwd: grad_y, grad_h, h -> grad_x
  } else {
    torch::NoGradGuard no_grad;
    run_gpu_timed(state, [&] { (void)fn(in); });
    set_bytes(state, 4 * unit);
  }
#endif
}

// Expert: h = x + gate * attn; y = adaRMS(h). 32 x 50 tokens, width 1024 (small: launch latency shows).
void BM_fused_adarms_norm_residual(benchmark::State& state) {
  if (!require_cuda(state)) return;
#ifdef VLATUNE_HAVE_CUDA
  const bool fused = state.range(0) == 1, backward = state.range(1) == 1;
  const int64_t w = kWidthExpert;
  auto in = std::vector<torch::Tensor>{rnd({kBatch, kSuffix, w}, 2), rnd({kBatch, kSuffix, w}), rnd({kBatch, 3 * w}),
                                       rnd({kBatch, 3 * w}, 0.5)};
  auto fn = [&](const std::vector<torch::Tensor>& x) {
    auto m = x[3].unsqueeze(1).chunk(3, -1);
    auto g = x[2].unsqueeze(1).chunk(3, -1)[2];
    auto o = fused ? k::adarms_norm_residual(x[0], x[1], g, m[0], m[1], 1e-6)
                   : k::adarms_norm_residual_ref(x[0], x[1], g, m[0], m[1], 1e-6);
    return std::vector<torch::Tensor>{o.h, o.y};
  };
  const double unit = 2.0 * kBatch * kSuffix * w;
  if (backward) {
    auto leaf = leaves(in);
    std::vector<torch::Tensor> seeds = {rnd({kBatch, kSuffix, w}), rnd({kBatch, kSuffix, w})};
    run_gpu_timed(state, [&] { fwd_bwd(fn, leaf, seeds); });
    set_bytes(state, 10 * unit);  // fwd: x, delta -> h, y; bwd: grad_y, grad_h, x, delta -> grad_x, grad_delta
  } else {
    torch::NoGradGuard no_grad;
    run_gpu_timed(state, [&] { (void)fn(in); });
    set_bytes(state, 4 * unit);
  }
#endif
}

// Merged QKV outputs of both branches -> q, k, v in the attention layout with RoPE.
void BM_fused_rope_qkv(benchmark::State& state) {
  if (!require_cuda(state)) return;
#ifdef VLATUNE_HAVE_CUDA
  const bool fused = state.range(0) == 1, backward = state.range(1) == 1;
  const int64_t cols = (kHeads + 2 * kKvHeads) * kHeadDim, n = kPrefix + kSuffix;
  auto pos = torch::arange(n, torch::TensorOptions().device(torch::kCUDA).dtype(torch::kFloat)).repeat({kBatch, 1});
  auto inv = torch::pow(10000.0, torch::arange(kHeadDim / 2, pos.options()) * (2.0 / kHeadDim)).reciprocal();
  auto ang = (pos.unsqueeze(-1) * inv).unsqueeze(1);
  auto cos = ang.cos(), sin = ang.sin();
  auto in = std::vector<torch::Tensor>{rnd({kBatch, kPrefix, cols}), rnd({kBatch, kSuffix, cols})};
  auto fn = [&](const std::vector<torch::Tensor>& x) {
    auto o = fused ? k::rope_qkv(x[0], x[1], cos, sin, kHeads, kKvHeads, true)
                   : k::rope_qkv_ref(x[0], x[1], cos, sin, kHeads, kKvHeads, true);
    return std::vector<torch::Tensor>{o.q, o.k, o.v};
  };
  const double unit = 2.0 * kBatch * n * cols;
  if (backward) {
    auto leaf = leaves(in);
    std::vector<torch::Tensor> seeds = {rnd({kBatch, kHeads, n, kHeadDim}), rnd({kBatch, kKvHeads, n, kHeadDim}),
                                        rnd({kBatch, kKvHeads, n, kHeadDim})};
    run_gpu_timed(state, [&] { fwd_bwd(fn, leaf, seeds); });
    set_bytes(state, 4 * unit);
  } else {
    torch::NoGradGuard no_grad;
    run_gpu_timed(state, [&] { (void)fn(in); });
    set_bytes(state, 2 * unit);
  }
#endif
}

// GeGLU on the prefix MLP's merged gate+up output [32 * 720, 2 * 16384] (the elementwise part only).
void BM_fused_geglu(benchmark::State& state) {
  if (!require_cuda(state)) return;
#ifdef VLATUNE_HAVE_CUDA
  const bool fused = state.range(0) == 1, backward = state.range(1) == 1;
  const int64_t rows = kBatch * kPrefix;
  const double unit = 2.0 * rows * kMlp;  // one [rows, F] bf16 tensor
  if (backward) {
    auto merged = rnd({rows, 2 * kMlp}, 2).requires_grad_(true);
    auto seed = rnd({rows, kMlp});
    if (fused) {
      // What geglu_linear's backward runs: the recomputed forward and the backward kernel.
      torch::NoGradGuard no_grad;
      run_gpu_timed(state, [&] {
        (void)k::geglu(merged);
        (void)k::geglu_backward(seed, merged);
      });
    } else {
      run_gpu_timed(state, [&] { (void)torch::autograd::grad({k::geglu_ref(merged)}, {merged}, {seed}); });
    }
    set_bytes(state, 8 * unit);  // fwd: merged -> out (3); bwd: grad, merged -> grad_merged (5)
  } else {
    torch::NoGradGuard no_grad;
    auto merged = rnd({rows, 2 * kMlp}, 2);
    run_gpu_timed(state, [&] { (void)(fused ? k::geglu(merged) : k::geglu_ref(merged)); });
    set_bytes(state, 3 * unit);
  }
#endif
}

// SigLIP: h = x + attn; y = LayerNorm(h). 32 samples x 2 images x 256 tokens, width 1152.
void BM_fused_layer_norm_residual(benchmark::State& state) {
  if (!require_cuda(state)) return;
#ifdef VLATUNE_HAVE_CUDA
  const bool fused = state.range(0) == 1, backward = state.range(1) == 1;
  const int64_t rows = kBatch * 2 * kVitTokens, w = kVitWidth;
  auto in = std::vector<torch::Tensor>{rnd({rows, w}, 3), rnd({rows, w}), rnd({w}, 0.2) + 1, rnd({w}, 0.1)};
  auto fn = [&](const std::vector<torch::Tensor>& x) {
    auto o = fused ? k::layer_norm_residual(x[0], x[1], x[2], x[3], 1e-6)
                   : k::layer_norm_residual_ref(x[0], x[1], x[2], x[3], 1e-6);
    return std::vector<torch::Tensor>{o.h, o.y};
  };
  const double unit = 2.0 * rows * w;
  if (backward) {
    auto leaf = leaves(in);
    std::vector<torch::Tensor> seeds = {rnd({rows, w}), rnd({rows, w})};
    run_gpu_timed(state, [&] { fwd_bwd(fn, leaf, seeds); });
    set_bytes(state, 8 * unit);  // fwd: x, delta -> h, y; bwd: grad_y, grad_h, h -> grad_x
  } else {
    torch::NoGradGuard no_grad;
    run_gpu_timed(state, [&] { (void)fn(in); });
    set_bytes(state, 4 * unit);
  }
#endif
}

// SigLIP MLP activation on fc1's output [32 * 2 * 256, 4304] (the elementwise part only). Fused backward = what
// gelu_linear's backward runs: one kernel writing grad_pre and the rebuilt activation.
void BM_fused_gelu(benchmark::State& state) {
  if (!require_cuda(state)) return;
#ifdef VLATUNE_HAVE_CUDA
  const bool fused = state.range(0) == 1, backward = state.range(1) == 1;
  const int64_t rows = kBatch * 2 * kVitTokens;
  const double unit = 2.0 * rows * kVitMlp;
  if (backward) {
    auto pre = rnd({rows, kVitMlp}, 2).requires_grad_(true);
    auto seed = rnd({rows, kVitMlp});
    if (fused) {
      torch::NoGradGuard no_grad;
      run_gpu_timed(state, [&] {
        (void)k::gelu(pre);
        (void)k::gelu_backward(seed, pre, /*rebuild_act=*/true);  // + the activation rebuilt over the gradient
      });
    } else {
      run_gpu_timed(state, [&] { (void)torch::autograd::grad({k::gelu_ref(pre)}, {pre}, {seed}); });
    }
    // fwd: pre -> out (2); bwd: grad, pre -> grad_pre (3). The fused side also writes the rebuilt activation
    // (one more unit it does not get credit for: the unfused side keeps the forward's output alive instead).
    set_bytes(state, 5 * unit);
  } else {
    torch::NoGradGuard no_grad;
    auto pre = rnd({rows, kVitMlp}, 2);
    run_gpu_timed(state, [&] { (void)(fused ? k::gelu(pre) : k::gelu_ref(pre)); });
    set_bytes(state, 2 * unit);
  }
#endif
}

// The joint attention of one decoder layer (q 8 heads, one K/V head, head_dim 256) at batch 32 with the step's
// prefix (2 images + 200 text positions, 20-199 of them real, seeded) and 50 action tokens. Arg `impl`: 0 = SDPA
// with the [B, 1, N, N] boolean mask (what ran before the varlen backends), 1 = FlashAttention-2 varlen, 2 = cuDNN
// padding masks (varlen_attention.h). No GB/s: attention is compute-bound; compare ms.
void BM_joint_attention(benchmark::State& state) {
  if (!require_cuda(state)) return;
#ifdef VLATUNE_HAVE_CUDA
  const int64_t impl = state.range(0);
  const bool backward = state.range(1) == 1;
  constexpr int64_t kText = 200, kImage = 2 * kVitTokens, p = kImage + kText, n = p + kSuffix;
  torch::manual_seed(0);
  auto text_len = torch::randint(20, kText, {kBatch, 1});
  auto valid = torch::cat({torch::ones({kBatch, kImage}, torch::kBool), torch::arange(kText).unsqueeze(0) < text_len,
                           torch::ones({kBatch, kSuffix}, torch::kBool)},
                          1)
                   .to(torch::kCUDA);
  const double scale = 1.0 / 16;
  auto in = std::vector<torch::Tensor>{rnd({kBatch * n, kHeads, kHeadDim}), rnd({kBatch * n, kKvHeads, kHeadDim}),
                                       rnd({kBatch * n, kKvHeads, kHeadDim})};
  std::function<std::vector<torch::Tensor>(const std::vector<torch::Tensor>&)> fn;
  if (impl == 0) {
    auto block = torch::cat({torch::zeros({p}, torch::kLong), torch::ones({kSuffix}, torch::kLong)}).to(torch::kCUDA);
    auto eye = torch::eye(n, torch::TensorOptions().dtype(torch::kBool).device(torch::kCUDA));
    auto mask = (((block.unsqueeze(0) <= block.unsqueeze(1)).unsqueeze(0) & valid.unsqueeze(1)) | eye).unsqueeze(1);
    fn = [mask, scale](const std::vector<torch::Tensor>& x) {
      auto heads = [](const torch::Tensor& t) { return t.view({kBatch, n, t.size(1), kHeadDim}).transpose(1, 2); };
      return std::vector<torch::Tensor>{at::scaled_dot_product_attention(heads(x[0]), heads(x[1]), heads(x[2]), mask,
                                                                         0.0, false, scale, /*enable_gqa=*/true)};
    };
  } else {
    const auto backend = impl == 2 ? k::VarlenBackend::kCudnn : k::VarlenBackend::kFlash;
    auto layout = std::make_shared<k::VarlenLayout>(k::joint_varlen_layout(valid, p, true, backend));
    fn = [layout, scale](const std::vector<torch::Tensor>& x) {
      return k::varlen_attention(x[0], x[1], x[2], *layout, scale);
    };
  }
  if (backward) {
    auto leaf = leaves(in);
    auto outs = fn(leaf);
    std::vector<torch::Tensor> seeds;
    for (const auto& o : outs) seeds.push_back(rnd(o.sizes().vec()));
    run_gpu_timed(state, [&] { fwd_bwd(fn, leaf, seeds); });
  } else {
    torch::NoGradGuard no_grad;
    run_gpu_timed(state, [&] { (void)fn(in); });
  }
#endif
}

}  // namespace

BENCHMARK(BM_joint_attention)
    ->ArgNames({"impl", "bwd"})
    ->ArgsProduct({{0, 1, 2}, {0, 1}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_copy_bf16)->UseManualTime()->Unit(benchmark::kMillisecond);
#define VLATUNE_FUSED_BENCH(name)     \
  BENCHMARK(name)                     \
      ->ArgNames({"fused", "bwd"})    \
      ->ArgsProduct({{0, 1}, {0, 1}}) \
      ->UseManualTime()               \
      ->Unit(benchmark::kMillisecond)
VLATUNE_FUSED_BENCH(BM_fused_rms_norm_residual);
VLATUNE_FUSED_BENCH(BM_fused_adarms_norm_residual);
VLATUNE_FUSED_BENCH(BM_fused_rope_qkv);
VLATUNE_FUSED_BENCH(BM_fused_geglu);
VLATUNE_FUSED_BENCH(BM_fused_layer_norm_residual);
VLATUNE_FUSED_BENCH(BM_fused_gelu);
