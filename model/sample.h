// Action sampling: openpi's `sample_actions` (spec §7.2). The prefix (images + prompt) runs once through SigLIP
// and the backbone into a per-layer K/V cache; then `num_steps` Euler steps of the suffix alone (the action expert
// over the H action tokens, attending to [cached prefix K/V; its own K/V]) integrate the flow from t = 1 (noise)
// to t = 0 (actions) with dt = -1/num_steps.
//
// Exactness: the prefix never attends to the suffix (spec §3, "Reusable prefix KV"), so the cached K/V equal the
// ones the joint forward computes at every step; positions and masks are the training forward's (prefix
// cumsum(valid) - 1, suffix Σvalid + j; padded prefix keys masked). sample_actions_uncached below is the plain
// reference: num_steps full joint forwards. The time conditioning (time MLP and every adaRMS modulation) depends
// only on t, which takes the same num_steps values on every call: it is computed once per batch size and reused
// (the modulation GEMM reads ~116 M expert weights, a quarter of a suffix step's memory traffic at full size).
//
// CUDA graph (SampleOptions::cuda_graph): the whole denoising loop (num_steps suffix passes and the Euler updates)
// is captured once per shape (batch, prefix length, horizon) and replayed; the prefix pass writes its K/V into the
// graph's cache tensors before each replay. The first call at a new shape runs eagerly and then captures (lazy
// set-up such as cuBLAS handles stays out of the capture); a capture that fails is reported once through
// graph_status() and sampling stays eager.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <torch/torch.h>

#include "model/batch.h"
#include "model/config.h"

namespace at::cuda {
struct CUDAGraph;
}

namespace vlatune::model {

class Pi05Impl;

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

// Milliseconds per phase of one sample() call (the device is synchronized at each boundary, so only ask for it
// when timing: the untimed call runs without host syncs after the prefix's shortcuts).
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
    torch::Tensor suffix_mask;                // [B, 1, H, P + H] bool: valid prefix keys and every suffix key
    torch::Tensor suffix_cos, suffix_sin;     // [B, 1, H, D / 2]: RoPE at positions Σvalid_prefix + j
    int64_t prefix_len = 0;                   // P
  };

 private:
  struct Conditioning {
    std::vector<torch::Tensor> cond;  // per step [B, width]
  };
  struct Graph;

  // Prefix pass of `batch` (shortcuts applied) into `cache` (allocated when empty or of another shape).
  void encode_prefix(const Pi05Batch& batch, int64_t horizon, Cache& cache, SampleTiming* timing);
  // One suffix pass at Euler step `step`: the velocity [B, H, action_dim] at x.
  torch::Tensor velocity(Cache& cache, const torch::Tensor& x, int64_t step);
  // The Euler loop from x = noise; returns x at t = 0.
  torch::Tensor denoise(Cache& cache, const torch::Tensor& noise);
  const Conditioning& conditioning(int64_t batch);
  bool fused(const torch::Tensor& like) const;

  Pi05Impl& model_;
  SampleOptions options_;
  std::vector<float> times_;
  c10::ScalarType compute_;
  std::map<int64_t, Conditioning> conditioning_;                                    // by batch size
  std::map<std::tuple<int64_t, int64_t, int64_t>, std::unique_ptr<Graph>> graphs_;  // by (B, P, H)
  std::string graph_status_ = "eager";
  bool graph_failed_ = false;
  int64_t captures_ = 0, replays_ = 0;
};

// The reference sampler: num_steps training forwards (prefix and suffix joint, nothing cached) at
// x_t = x (actions = noise = x), t = t_k, with the same Euler updates. For tests.
torch::Tensor sample_actions_uncached(Pi05Impl& model, const Pi05Batch& batch, const torch::Tensor& noise,
                                      int64_t num_steps, const ForwardOptions& options = {});

}  // namespace vlatune::model
