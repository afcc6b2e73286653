// SigLIP So400m/14 vision tower (spec §2.1), registered under the HF/openpi names:
// vision_tower.vision_model.{embeddings.{patch_embedding, position_embedding}, encoder.layers.{i}.{self_attn.
// {q,k,v,out}_proj, layer_norm1, mlp.{fc1, fc2}, layer_norm2}, post_layernorm}.
#pragma once

#include <vector>

#include "model/config.h"
#include "model/layers.h"

namespace vlatune::model {

class SiglipAttentionImpl : public ScopedModule {
 public:
  SiglipAttentionImpl(const VisionConfig& cfg, torch::TensorOptions options);
  // Bidirectional MHA, all with biases. fused: q/k/v as one GEMM (model::merged_gemm: FP8 when chosen) in this
  // module's scope, the attention on cuDNN from the merged output (kernels/qkv_attention.h) when `backend` allows it.
  torch::Tensor forward(const torch::Tensor& x, Attention mode, bool fused = false,
                        kernels::AttentionBackend backend = kernels::AttentionBackend::kAuto);
  Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, out_proj{nullptr};
  int64_t heads;
};
TORCH_MODULE(SiglipAttention);

class SiglipMLPImpl : public ScopedModule {
 public:
  SiglipMLPImpl(const VisionConfig& cfg, torch::TensorOptions options);
  // fc2(gelu_tanh(fc1(x))). fused: the GELU kernel and fc2 as one autograd node (kernels::gelu_linear, or
  // model::float8_gelu_linear when fc2 runs in FP8) that saves fc1's output only.
  torch::Tensor forward(const torch::Tensor& x, bool fused = false);
  Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(SiglipMLP);

// Pre-LN block: x += attn(ln1(x)); x += mlp(ln2(x)). fused: LayerNorm kernels (the attention residual inside
// layer_norm2's), q/k/v as one GEMM read by SDPA as strided views, the GELU kernel with fc2 (gelu_linear).
class SiglipEncoderLayerImpl : public ScopedModule {
 public:
  SiglipEncoderLayerImpl(const VisionConfig& cfg, torch::TensorOptions options);
  torch::Tensor forward(const torch::Tensor& x, Attention mode, bool fused = false,
                        kernels::AttentionBackend backend = kernels::AttentionBackend::kAuto);
  SiglipAttention self_attn{nullptr};
  LayerNorm layer_norm1{nullptr};
  SiglipMLP mlp{nullptr};
  LayerNorm layer_norm2{nullptr};
};
TORCH_MODULE(SiglipEncoderLayer);

class SiglipEmbeddingsImpl : public ScopedModule {
 public:
  SiglipEmbeddingsImpl(const VisionConfig& cfg, torch::TensorOptions options);
  // pixels [n, 3, image, image] -> [n, tokens, width]: patchify (row-major tokens) + learned positions,
  // computed in math_dtype (openpi runs both in fp32), returned in `compute`.
  torch::Tensor forward(const torch::Tensor& pixels, c10::ScalarType compute);
  PatchConv patch_embedding{nullptr};
  Embedding position_embedding{nullptr};
};
TORCH_MODULE(SiglipEmbeddings);

class SiglipEncoderImpl : public ScopedModule {
 public:
  SiglipEncoderImpl(const VisionConfig& cfg, torch::TensorOptions options);
  torch::nn::ModuleList layers_list{nullptr};  // registered as "layers"
  std::vector<SiglipEncoderLayer> layers;
};
TORCH_MODULE(SiglipEncoder);

class SiglipVisionTransformerImpl : public ScopedModule {
 public:
  SiglipVisionTransformerImpl(const VisionConfig& cfg, torch::TensorOptions options);
  SiglipEmbeddings embeddings{nullptr};
  SiglipEncoder encoder{nullptr};
  LayerNorm post_layernorm{nullptr};
};
TORCH_MODULE(SiglipVisionTransformer);

// "vision_tower": pixels [n, 3, image, image] (any float dtype) -> features [n, tokens, width] in `compute`.
// recompute_layers[i] checkpoints encoder layer i (empty = none). fused: the fused encoder layers and
// post_layernorm (JointInputs::fused).
class SiglipVisionTowerImpl : public ScopedModule {
 public:
  SiglipVisionTowerImpl(const VisionConfig& cfg, torch::TensorOptions options);
  torch::Tensor forward(const torch::Tensor& pixels, c10::ScalarType compute, Attention mode,
                        const std::vector<bool>& recompute_layers = {}, bool fused = false,
                        kernels::AttentionBackend backend = kernels::AttentionBackend::kAuto);
  SiglipVisionTransformer vision_model{nullptr};
};
TORCH_MODULE(SiglipVisionTower);

}  // namespace vlatune::model
