// Pi0.5 configuration: the full openpi sizes (spec §2) and the fixed tiny config every CPU test uses
// (DESIGN.md "Tiny config"), plus the switches of one forward pass (exact shortcuts, attention path, precision).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <c10/core/ScalarType.h>

#include "kernels/attention_backend.h"

namespace vlatune::model {

// SigLIP tower. Tokens per image = (image / patch)^2.
struct VisionConfig {
  int64_t width, depth, mlp, heads, patch, image;
  int64_t tokens_per_image() const { return (image / patch) * (image / patch); }
};

// One Gemma weight set. The action expert has no token embedding: its vocab is 0 (unused).
struct GemmaConfig {
  int64_t width, depth, mlp, heads, kv_heads, head_dim, vocab;
};

struct Pi05Config {
  VisionConfig vision;
  GemmaConfig backbone;  // PaliGemma Gemma-2B: the prefix branch
  GemmaConfig expert;    // Gemma-300M action expert: the suffix branch
  int64_t action_dim = 32;

  static Pi05Config full();  // 3,353,433,872 parameters (spec §2.5)
  static Pi05Config tiny();
  // "tiny" | "full"; anything else throws std::invalid_argument naming the value.
  static Pi05Config named(const std::string& name);
  // Throws std::invalid_argument when the joint attention cannot work (expert heads/head_dim/kv_heads/depth
  // differ from the backbone's, heads not a multiple of kv_heads, odd head_dim, image not a multiple of patch).
  void validate() const;
};

// kMaterialized: repeat K/V to every query head, QK^T, fp32 masked softmax, probs cast to the activation dtype,
// PV: the plain reference path, the oracle of the tests. kLean: at::scaled_dot_product_attention with a boolean
// mask and enable_gqa (no repeat_kv copy; on the GPU no NxN probabilities kept for backward). Same math.
enum class Attention { kLean, kMaterialized };

// Which implementation runs the decoder's elementwise work and projections (kernels/fused_ops.h, fused.md):
// - kAuto: on CUDA the fused kernels (RMSNorm/adaRMS with the residual fused, RoPE on Q and K in one pass,
//   GeGLU with its output recomputed in backward) and merged QKV / gate+up GEMMs; elsewhere the reference.
// - kReference: the reference modules everywhere (unfused ATen sequences: the oracle of the GPU tests).
// - kFused: the fused structure everywhere; on the CPU the autograd wrappers run their ATen references and
//   analytic backwards (tests of the wrappers on the tiny model).
enum class Kernels { kAuto, kReference, kFused };

struct ForwardOptions {
  // Drop camera slots masked for the whole batch before SigLIP (exact: their tokens are never keys and take
  // no positions). One host sync per step for the decision.
  bool prune_slots = true;
  // Cut the text to the longest real prompt of the batch (last true mask index + 1), rounded up to
  // trim_multiple and capped at the batch's text length (exact: padding is never a key, takes no position).
  bool trim_text = true;
  int64_t trim_multiple = 16;
  // Skip the last layer's dead prefix work (prefix q_proj, prefix attention rows, prefix o_proj, pre-FFN norm,
  // MLP, final prefix norm): none of it reaches the loss. Call Pi05Impl::fill_missing_grads() after backward.
  bool skip_dead = true;
  // Keep the backbone's prefix stream on the live prefix rows only (valid image and text positions, padded up to
  // live_row_multiple with dead ones): a padded text row is never a key and never reaches the loss, so its norms,
  // projections and MLP are dead work (exact for the loss and every gradient; the attention sees zero Q/K/V on the
  // rows left out, and FP8 scales are taken over the rows that run). The row count comes from the batch's
  // valid_images and valid_tokens where set, else from the masks read back (a host sync).
  bool skip_padded_rows = true;
  int64_t live_row_multiple = 64;
  Attention attention = Attention::kLean;
  // The kernels of the lean attention on CUDA (the recipe's model_options.attention_backend).
  kernels::AttentionBackend attention_backend = kernels::AttentionBackend::kAuto;
  Kernels kernels = Kernels::kAuto;
  // The loss averages (v - u)^2 over B, H and the first loss_action_dim action dims (openpi: all 32).
  int64_t loss_action_dim = 32;
  // Activation dtype. Unset: the parameters' dtype. Set to bf16 with fp32 parameters for "fp32-master"
  // precision (every Linear casts its weight to the input's dtype). Norm statistics, RoPE, softmax, the time
  // embedding and the velocity head run in fp32 (fp64 when the activations are fp64).
  std::optional<c10::ScalarType> compute_dtype;
  // Debug: return the prefix hidden state entering every joint layer (and leaving the last one, unless the
  // last layer's prefix work is skipped) in Output::prefix_states.
  bool keep_prefix_states = false;
};

}  // namespace vlatune::model
