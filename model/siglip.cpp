#include "model/siglip.h"

#include <cmath>

#include "kernels/qkv_attention.h"
#include "model/float8_linear.h"
#include "model/merged_gemm.h"
#include "model/recompute.h"
#include "profiler/scope.h"

namespace vlatune::model {

namespace {
constexpr double kLayerNormEps = 1e-6;
}

SiglipAttentionImpl::SiglipAttentionImpl(const VisionConfig& cfg, torch::TensorOptions options) : heads(cfg.heads) {
  q_proj = register_module("q_proj", Linear(cfg.width, cfg.width, true, options));
  k_proj = register_module("k_proj", Linear(cfg.width, cfg.width, true, options));
  v_proj = register_module("v_proj", Linear(cfg.width, cfg.width, true, options));
  out_proj = register_module("out_proj", Linear(cfg.width, cfg.width, true, options));
}

torch::Tensor SiglipAttentionImpl::forward(const torch::Tensor& x, Attention mode, bool fused,
                                           kernels::AttentionBackend backend) {
  profiler::Scope scope(fqn());
  const int64_t n = x.size(0), t = x.size(1), width = x.size(2);
  auto split = [&](const torch::Tensor& y) { return y.view({n, t, heads, width / heads}).transpose(1, 2); };
  if (fused) {
    if (profiler::scopes_enabled())
      profiler::note_gemm({&q_proj->fqn(), &k_proj->fqn(), &v_proj->fqn()}, x.numel() / width, width, 3 * width);
    auto qkv = merged_gemm(x, {q_proj.get(), k_proj.get(), v_proj.get()});  // [n, t, q | k | v]
    if (mode == Attention::kLean && kernels::qkv_attention_supported(qkv, heads, backend))
      return out_proj(kernels::qkv_attention(qkv, heads, 1.0 / std::sqrt(static_cast<double>(width / heads))));
    // Strided [n, heads, t, d] views of the merged output, read in place by SDPA (no copy for the layout); their
    // backward is one stack into the merged layout (narrow views cost a zero-filled [n, t, 3 * width] each).
    auto heads_qkv = kernels::split_qkv_heads(qkv, heads);
    auto o = attention_core(heads_qkv.q, heads_qkv.k, heads_qkv.v, torch::Tensor(), mode);
    return out_proj(o.transpose(1, 2).reshape({n, t, width}));
  }
  auto o = attention_core(split(q_proj(x)), split(k_proj(x)), split(v_proj(x)), torch::Tensor(), mode);
  return out_proj(o.transpose(1, 2).reshape({n, t, width}));
}

SiglipMLPImpl::SiglipMLPImpl(const VisionConfig& cfg, torch::TensorOptions options) {
  fc1 = register_module("fc1", Linear(cfg.width, cfg.mlp, true, options));
  fc2 = register_module("fc2", Linear(cfg.mlp, cfg.width, true, options));
}

torch::Tensor SiglipMLPImpl::forward(const torch::Tensor& x, bool fused) {
  profiler::Scope scope(fqn());
  if (!fused) return fc2(gelu_tanh(fc1(x)));
  auto pre = fc1(x);  // the GEMM adds the bias in its epilogue (bf16 or FP8)
  if (profiler::scopes_enabled())
    profiler::note_gemm({&fc2->fqn()}, pre.numel() / pre.size(-1), fc2->weight.size(1), fc2->weight.size(0));
  // GELU kernel, then fc2 in its own scope; backward saves only `pre` (the GELU output is rebuilt). An FP8 fc2 has
  // no adapter (Pi05Impl::set_fp8 refuses one). With fc1 in FP8 too (and pre's gradient going to it alone), fc2's
  // backward casts that gradient for fc1's GEMMs itself.
  if (fc2->fp8) {
    Float8State* producer = fc1->fp8 && !fc1->has_lora() ? fc1->fp8.get() : nullptr;
    return model::float8_gelu_linear(pre, fc2->weight, fc2->bias, *fc2->fp8, fc2->fqn(), producer);
  }
  auto y = kernels::gelu_linear(pre, fc2->weight, fc2->bias, fc2->fqn());
  if (!fc2->has_lora()) return y;
  // The adapter's first GEMM reads gelu(pre) through the same node, so the GELU output is rebuilt for it too.
  profiler::Scope lora_scope(fc2->fqn());
  auto z = kernels::gelu_linear(pre, fc2->lora_A.to(pre.scalar_type()), torch::Tensor(), "") * fc2->lora_scale();
  return y + at::linear(z, fc2->lora_B.to(z.scalar_type()));
}

SiglipEncoderLayerImpl::SiglipEncoderLayerImpl(const VisionConfig& cfg, torch::TensorOptions options) {
  self_attn = register_module("self_attn", SiglipAttention(cfg, options));
  layer_norm1 = register_module("layer_norm1", LayerNorm(cfg.width, kLayerNormEps, options));
  mlp = register_module("mlp", SiglipMLP(cfg, options));
  layer_norm2 = register_module("layer_norm2", LayerNorm(cfg.width, kLayerNormEps, options));
}

torch::Tensor SiglipEncoderLayerImpl::forward(const torch::Tensor& x, Attention mode, bool fused,
                                              kernels::AttentionBackend backend) {
  profiler::Scope scope(fqn());
  const kernels::OpPath path = fused ? kernels::OpPath::kFused : kernels::OpPath::kReference;
  // The attention residual runs inside layer_norm2 (its kernel on the fused path); the MLP residual stays an ATen
  // add (fusing it into the next layer's layer_norm1 would cross the layer's recompute boundary).
  auto n1 = layer_norm1->forward(x, torch::Tensor(), path);
  auto attn = self_attn->forward(n1.y, mode, fused, backend);
  // n1.h: x as seen through layer_norm1, whose backward kernel then adds layer_norm2's gradient of x (fused path).
  auto n2 = layer_norm2->forward(n1.h, attn, path);
  return n2.h + mlp->forward(n2.y, fused);
}

SiglipEmbeddingsImpl::SiglipEmbeddingsImpl(const VisionConfig& cfg, torch::TensorOptions options) {
  patch_embedding = register_module("patch_embedding", PatchConv(3, cfg.width, cfg.patch, options));
  position_embedding = register_module("position_embedding", Embedding(cfg.tokens_per_image(), cfg.width, options));
}

torch::Tensor SiglipEmbeddingsImpl::forward(const torch::Tensor& pixels, c10::ScalarType compute) {
  profiler::Scope scope(fqn());
  const auto md = math_dtype(compute);
  auto patches = patch_embedding(pixels.to(md)).flatten(2).transpose(1, 2);  // [n, tokens, width], row-major
  auto ids = torch::arange(patches.size(1), torch::TensorOptions().dtype(torch::kLong).device(pixels.device()));
  return (patches + position_embedding(ids).to(md)).to(compute);
}

SiglipEncoderImpl::SiglipEncoderImpl(const VisionConfig& cfg, torch::TensorOptions options) {
  layers_list = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < cfg.depth; ++i) {
    layers.push_back(SiglipEncoderLayer(cfg, options));
    layers_list->push_back(layers.back());
  }
}

SiglipVisionTransformerImpl::SiglipVisionTransformerImpl(const VisionConfig& cfg, torch::TensorOptions options) {
  embeddings = register_module("embeddings", SiglipEmbeddings(cfg, options));
  encoder = register_module("encoder", SiglipEncoder(cfg, options));
  post_layernorm = register_module("post_layernorm", LayerNorm(cfg.width, kLayerNormEps, options));
}

SiglipVisionTowerImpl::SiglipVisionTowerImpl(const VisionConfig& cfg, torch::TensorOptions options) {
  vision_model = register_module("vision_model", SiglipVisionTransformer(cfg, options));
}

torch::Tensor SiglipVisionTowerImpl::forward(const torch::Tensor& pixels, c10::ScalarType compute, Attention mode,
                                             const std::vector<bool>& recompute_layers, bool fused,
                                             kernels::AttentionBackend backend) {
  profiler::Scope scope(fqn());
  auto& vm = *vision_model;
  profiler::Scope model_scope(vm.fqn());
  auto x = vm.embeddings->forward(pixels, compute);
  // Fused: row-major tokens. The embeddings keep the conv's transposed layout ([n, width, tokens] in memory), which
  // the reference path carries through every residual add of the encoder: each LayerNorm copies its input (forward
  // and backward) and the adds run on mixed strides. Same values; the kernels need rows anyway.
  if (fused) x = x.contiguous();
  {
    profiler::Scope encoder_scope(vm.encoder->fqn());
    auto& layers = vm.encoder->layers;
    for (size_t i = 0; i < layers.size(); ++i) {
      if (i < recompute_layers.size() && recompute_layers[i]) {
        SiglipEncoderLayerImpl* layer = layers[i].get();
        std::vector<torch::Tensor> params = layer->parameters();
        x = recompute(
            [layer, mode, fused, backend](const std::vector<torch::Tensor>& in) -> std::vector<torch::Tensor> {
              return {layer->forward(in[0], mode, fused, backend)};
            },
            {x}, params)[0];
      } else {
        x = layers[i]->forward(x, mode, fused, backend);
      }
    }
  }
  return vm.post_layernorm->forward(x, torch::Tensor(), fused ? kernels::OpPath::kFused : kernels::OpPath::kReference)
      .y;
}

}  // namespace vlatune::model
