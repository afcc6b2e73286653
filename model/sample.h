// Action sampling: openpi's `sample_actions` (spec §7.2). The prefix (images + prompt) runs once through SigLIP
// and the backbone into a per-layer K/V cache; then `num_steps` Euler steps of the suffix alone (the action expert
// over the H action tokens, attending to [cached prefix K/V; its own K/V]) integrate the flow from t = 1 (noise)
// to t = 0 (actions) with dt = -1/num_steps.
//
// Exactness: the prefix never attends to the suffix (spec §3, "Reusable prefix KV"), so the cached K/V equal the
// ones the joint forward computes at every step; positions and masks are the training forward's (prefix
// cumsum(valid) - 1, suffix Σvalid + j; padded prefix keys masked; with no padded key left after the shortcuts, as
// for a single prompt, trimmed to its length, no mask at all). sample_actions_uncached below is the plain
// reference: num_steps full joint forwards. The time conditioning (the time MLP and every adaRMS modulation)
// depends only on t, which takes the same num_steps values on every call: it is computed once per batch size and
// reused (the modulation GEMMs read ~116 M expert weights, a quarter of a suffix step's memory traffic at full
// size, in 37 launches per step).
//
// CUDA graph (SampleOptions::cuda_graph): a chunk is three captured graphs replayed back to back, captured once
// per shape (batch, camera slots, image side, prompt length, horizon, masked): SigLIP + projector, the prefix pass
// into the K/V cache, and the denoising loop (num_steps suffix passes and the Euler updates). The inputs are
// copied into the graphs' static tensors before each replay; the input shortcuts (which read the masks on the
// host) run before it. The first call at a new shape runs eagerly and then captures (lazy set-up such as cuBLAS
// handles and cuDNN plans stays out of the capture); a capture that fails is reported once through graph_status()
// and sampling stays eager.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <torch/torch.h>

#include "kernels/fused_ops.h"
#include "model/batch.h"
#include "model/config.h"

namespace at::cuda {
struct CUDAGraph;
}

namespace vlatune::model {

class Pi05Impl;
class GemmaAttentionImpl;

struct SampleOptions {
  int64_t num_steps = 10;  // Euler steps (openpi: 10)
  // Exact shortcuts (empty camera slots, text padding) and the kernels/attention/precision of the passes; the
  // training-only fields (loss_action_dim, skip_dead: the last layer's prefix work is always skipped here) are
  // ignored.
  ForwardOptions forward;
  bool cuda_graph = false;  // capture the denoising loop (CUDA only; ignored elsewhere)
};

// openpi's time grid: t = 1 and dt = -1/num_steps in fp32, t += dt while t >= -dt/2, so t_k = 1, 0.9, ..., 0.1
// for 10 steps (fp32 sums, as openpi's tensors accumulate them).
std::vector<float> euler_times(int64_t num_steps);

// Flow-matching noise ε ~ N(0, 1), [batch, horizon, action_dim] fp32, from a CPU generator seeded with `seed`, so
// the same seed gives the same noise on every device.
torch::Tensor sample_noise(int64_t batch, int64_t horizon, int64_t action_dim, uint64_t seed);

// Milliseconds per phase of one sample() call. Eager: wall time, the device synchronized at each boundary (only ask
// for it when timing). Graph replays: the GPU time between events recorded around each graph, no syncs inside.
struct SampleTiming {
  double vision_ms = 0;  // SigLIP + projector
  double prefix_ms = 0;  // text embedding + the backbone's prefix pass into the K/V cache
  double suffix_ms = 0;  // the num_steps suffix passes and Euler updates (a graph replay when captured)
};

class Sampler {
 public:
  // The model must keep its weights while the sampler lives: the time conditioning is cached from them (make a
  // new Sampler after a weight update). On the fused path, pack the model's merged weights first
  // (Pi05Impl::pack_merged_weights), or every merged GEMM concatenates its weights. Throws
  // std::invalid_argument for num_steps < 1.
  explicit Sampler(Pi05Impl& model, SampleOptions options = {});
  ~Sampler();
  Sampler(const Sampler&) = delete;
  Sampler& operator=(const Sampler&) = delete;

  // Actions [B, H, action_dim] (fp32, or fp64 for fp64 activations), normalized model space, from the batch's
  // images, image_masks, tokens and token_masks (on the model's device; actions/noise/time unused) and the
  // initial noise [B, H, action_dim] (any float dtype, any device). Runs without autograd.
  torch::Tensor sample(const Pi05Batch& batch, const torch::Tensor& noise, SampleTiming* timing = nullptr);

  // "captured" (a graph exists), "eager" (none yet, or not CUDA / not asked), or the capture failure.
  const std::string& graph_status() const { return graph_status_; }
  int64_t graph_captures() const { return captures_; }
  int64_t graph_replays() const { return replays_; }

  // The K/V cache and the suffix's attention inputs (exposed for tests).
  struct Cache {
    std::vector<torch::Tensor> keys, values;  // per layer [B, kv_heads, P + H, D]: prefix rows, then the suffix's
    torch::Tensor suffix_mask;                // [B, 1, H, P + H] bool: valid prefix keys and every suffix key;
                                              // undefined when no prefix key is padding
    torch::Tensor suffix_cos, suffix_sin;     // [B, 1, H, D / 2]: RoPE at positions Σvalid_prefix + j
    int64_t prefix_len = 0;                   // P
  };

 private:
  struct Conditioning {
    // Per Euler step: the adaRMS modulations [B, 3 * width] of the expert's layers (input, post-attention) in
    // layer order, then the final norm's.
    std::vector<std::vector<torch::Tensor>> modulations;
  };
  // The batch after the input shortcuts, and whether any prefix position is padding (then attention is masked).
  struct Prepared {
    Pi05Batch batch;
    bool masked = true;
  };
  using GraphKey = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, bool>;
  struct Graph;

  // The shortcuts (host syncs: the masks are read) and the mask decision.
  Prepared prepare(const Pi05Batch& raw) const;
  // SigLIP + projector: the image tokens [B, slots * tokens_per_image, width], undefined without camera slots.
  torch::Tensor vision(const Pi05Batch& b);
  // The prefix pass into a newly allocated `cache`.
  void encode_prefix(const Pi05Batch& b, const torch::Tensor& image_tokens, bool masked, int64_t horizon, Cache& cache);
  // q (with_q) [B, H, T, D], k, v [B, Hk, T, D] of attention `a` from its input y, RoPE applied with the tables.
  kernels::QkvHeads project_qkv(GemmaAttentionImpl& a, const torch::Tensor& y, bool with_q, const torch::Tensor& cos,
                                const torch::Tensor& sin, bool suffix) const;
  // One suffix pass at Euler step `step`: the velocity [B, H, action_dim] at x.
  torch::Tensor velocity(Cache& cache, const torch::Tensor& x, int64_t step);
  // The Euler loop from x = noise; returns x at t = 0.
  torch::Tensor denoise(Cache& cache, const torch::Tensor& noise);
  torch::Tensor run_eager(const Prepared& prepared, const torch::Tensor& x0, SampleTiming* timing,
                          std::chrono::steady_clock::time_point t0);
  // Captures the three phases for `key` (CUDA builds; called on the capture stream).
  void capture(const GraphKey& key, const Prepared& prepared, const torch::Tensor& x0);
  const Conditioning& conditioning(int64_t batch);
  bool fused(const torch::Tensor& like) const;

  Pi05Impl& model_;
  SampleOptions options_;
  std::vector<float> times_;
  c10::ScalarType compute_;
  std::map<int64_t, Conditioning> conditioning_;  // by batch size
  // A single prompt's shape is its exact length, so a server sees many: the least recently used go beyond this.
  static constexpr size_t kGraphsKept = 16;
  std::map<GraphKey, std::unique_ptr<Graph>> graphs_;  // by shape
  int64_t calls_ = 0;
  std::string graph_status_ = "eager";
  bool graph_failed_ = false;
  int64_t captures_ = 0, replays_ = 0;
};

// The reference sampler: num_steps training forwards (prefix and suffix joint, nothing cached) at
// x_t = x (actions = noise = x), t = t_k, with the same Euler updates. For tests.
torch::Tensor sample_actions_uncached(Pi05Impl& model, const Pi05Batch& batch, const torch::Tensor& noise,
                                      int64_t num_steps, const ForwardOptions& options = {});

}  // namespace vlatune::model
