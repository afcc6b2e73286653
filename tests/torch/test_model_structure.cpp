// Pi0.5 structure: openpi FQNs and shapes, the exact parameter count, configs, random batches, recompute names.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <map>
#include <set>

#include "model/pi05.h"

using namespace vlatune::model;

namespace {
std::map<std::string, std::vector<int64_t>> shapes_of(const torch::nn::Module& m) {
  std::map<std::string, std::vector<int64_t>> out;
  for (const auto& item : m.named_parameters()) out[item.key()] = item.value().sizes().vec();
  return out;
}
}  // namespace

TEST_CASE("The full Pi0.5 built on the meta device has exactly 3,353,433,872 parameters under openpi names",
          "[model]") {
  Pi05Impl model(Pi05Config::full(), torch::Device(torch::kMeta));
  CHECK(count_parameters(model) == 3353433872LL);
  auto shapes = shapes_of(model);
  const std::string pg = "paligemma_with_expert.paligemma.model.";
  const std::string vm = pg + "vision_tower.vision_model.";
  const std::string lm = pg + "language_model.";
  const std::string ex = "paligemma_with_expert.gemma_expert.model.";
  const std::map<std::string, std::vector<int64_t>> expected = {
      {vm + "embeddings.patch_embedding.weight", {1152, 3, 14, 14}},
      {vm + "embeddings.patch_embedding.bias", {1152}},
      {vm + "embeddings.position_embedding.weight", {256, 1152}},
      {vm + "encoder.layers.0.self_attn.q_proj.weight", {1152, 1152}},
      {vm + "encoder.layers.26.self_attn.out_proj.bias", {1152}},
      {vm + "encoder.layers.26.layer_norm1.weight", {1152}},
      {vm + "encoder.layers.13.layer_norm2.bias", {1152}},
      {vm + "encoder.layers.5.mlp.fc1.weight", {4304, 1152}},
      {vm + "encoder.layers.5.mlp.fc2.weight", {1152, 4304}},
      {vm + "post_layernorm.weight", {1152}},
      {pg + "multi_modal_projector.linear.weight", {2048, 1152}},
      {pg + "multi_modal_projector.linear.bias", {2048}},
      {lm + "embed_tokens.weight", {257152, 2048}},
      {lm + "layers.0.self_attn.q_proj.weight", {2048, 2048}},
      {lm + "layers.17.self_attn.k_proj.weight", {256, 2048}},
      {lm + "layers.17.self_attn.v_proj.weight", {256, 2048}},
      {lm + "layers.3.self_attn.o_proj.weight", {2048, 2048}},
      {lm + "layers.7.mlp.gate_proj.weight", {16384, 2048}},
      {lm + "layers.7.mlp.up_proj.weight", {16384, 2048}},
      {lm + "layers.7.mlp.down_proj.weight", {2048, 16384}},
      {lm + "layers.7.input_layernorm.weight", {2048}},
      {lm + "layers.7.post_attention_layernorm.weight", {2048}},
      {lm + "norm.weight", {2048}},
      {ex + "layers.0.self_attn.q_proj.weight", {2048, 1024}},
      {ex + "layers.0.self_attn.k_proj.weight", {256, 1024}},
      {ex + "layers.0.self_attn.o_proj.weight", {1024, 2048}},
      {ex + "layers.11.mlp.gate_proj.weight", {4096, 1024}},
      {ex + "layers.11.mlp.down_proj.weight", {1024, 4096}},
      {ex + "layers.11.input_layernorm.dense.weight", {3072, 1024}},
      {ex + "layers.11.input_layernorm.dense.bias", {3072}},
      {ex + "layers.17.post_attention_layernorm.dense.weight", {3072, 1024}},
      {ex + "norm.dense.weight", {3072, 1024}},
      {ex + "norm.dense.bias", {3072}},
      {"action_in_proj.weight", {1024, 32}},
      {"action_in_proj.bias", {1024}},
      {"action_out_proj.weight", {32, 1024}},
      {"action_out_proj.bias", {32}},
      {"time_mlp_in.weight", {1024, 1024}},
      {"time_mlp_out.bias", {1024}},
  };
  for (const auto& [name, shape] : expected) {
    INFO(name);
    REQUIRE(shapes.count(name) == 1);
    CHECK(shapes[name] == shape);
  }
  // 27 SigLIP layers x 16 tensors, 18 backbone layers x 9, 18 expert layers x 11, and the rest.
  CHECK(shapes.size() == 3 + 27 * 16 + 2 + 2 + 1 + 18 * 9 + 1 + 18 * 11 + 2 + 8);
  for (const auto& [name, shape] : shapes) {
    INFO(name);
    CHECK(name.find("lm_head") == std::string::npos);
    CHECK(name.find("gemma_expert.model.embed_tokens") == std::string::npos);
    CHECK(name.find("gemma_expert.model.layers.0.input_layernorm.weight") == std::string::npos);
  }
}

TEST_CASE("Every module of the model knows its FQN", "[model]") {
  Pi05Impl model(Pi05Config::tiny());
  size_t scoped = 0;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    if (auto* m = dynamic_cast<ScopedModule*>(item.value().get())) {
      CHECK(m->fqn() == item.key());
      ++scoped;
    }
  }
  CHECK(scoped > 50);
  CHECK(model.language_model().layers[1]->mlp->fqn() ==
        "paligemma_with_expert.paligemma.model.language_model.layers.1.mlp");
  CHECK(model.expert_model().norm_ada->dense->fqn() == "paligemma_with_expert.gemma_expert.model.norm.dense");
}

TEST_CASE("Pi05Config names tiny and full and rejects anything else, naming the value", "[model]") {
  CHECK(Pi05Config::named("tiny").backbone.width == 64);
  CHECK(Pi05Config::named("full").backbone.width == 2048);
  CHECK(Pi05Config::tiny().vision.tokens_per_image() == 4);
  CHECK(Pi05Config::full().vision.tokens_per_image() == 256);
  CHECK_THROWS_AS(Pi05Config::named("huge"), std::invalid_argument);
  CHECK_THROWS_WITH(Pi05Config::named("huge"), Catch::Contains("'huge'"));
  Pi05Config bad = Pi05Config::tiny();
  bad.expert.head_dim = 8;
  CHECK_THROWS_WITH(Pi05Config(bad).validate(), Catch::Contains("head_dim"));
}

TEST_CASE("make_random_batch gives the documented shapes, masks and ranges", "[model]") {
  const auto cfg = Pi05Config::tiny();
  torch::Generator gen = at::globalContext().defaultGenerator(torch::kCPU).clone();
  gen.set_current_seed(7);
  auto b = make_random_batch(cfg, /*batch=*/4, /*slots=*/3, /*valid_slots=*/2, /*text_len=*/20, /*min_prompt=*/3,
                             /*max_prompt=*/9, /*horizon=*/10, &gen, torch::kCPU);
  CHECK(b.images.sizes() == torch::IntArrayRef({4, 3, 3, 28, 28}));
  CHECK(b.image_masks.sizes() == torch::IntArrayRef({4, 3}));
  CHECK(b.tokens.sizes() == torch::IntArrayRef({4, 20}));
  CHECK(b.token_masks.sizes() == torch::IntArrayRef({4, 20}));
  CHECK(b.actions.sizes() == torch::IntArrayRef({4, 10, 32}));
  CHECK(b.noise.sizes() == torch::IntArrayRef({4, 10, 32}));
  CHECK(b.time.sizes() == torch::IntArrayRef({4}));
  CHECK(b.image_masks.scalar_type() == torch::kBool);
  CHECK(b.tokens.scalar_type() == torch::kLong);
  CHECK(b.images.min().item<float>() >= -1.0f);
  CHECK(b.images.max().item<float>() <= 1.0f);
  CHECK(b.image_masks.select(1, 0).all().item<bool>());
  CHECK(b.image_masks.select(1, 1).all().item<bool>());
  CHECK_FALSE(b.image_masks.select(1, 2).any().item<bool>());
  auto lengths = b.token_masks.sum(1);
  CHECK(lengths.min().item<int64_t>() >= 3);
  CHECK(lengths.max().item<int64_t>() <= 9);
  // Real tokens in [1, vocab), padding 0, masks right-padded (a prefix of trues).
  CHECK(torch::equal(b.tokens.ne(0), b.token_masks));
  CHECK(b.tokens.max().item<int64_t>() < cfg.backbone.vocab);
  auto cummin = std::get<0>(b.token_masks.to(torch::kInt).cummin(1));
  CHECK(torch::equal(cummin, b.token_masks.to(torch::kInt)));
  CHECK(b.time.min().item<float>() >= 0.001f);
  CHECK(b.time.max().item<float>() <= 1.0f);
  // Same seed, same batch.
  gen.set_current_seed(7);
  auto again = make_random_batch(cfg, 4, 3, 2, 20, 3, 9, 10, &gen, torch::kCPU);
  CHECK(torch::equal(again.noise, b.noise));
  CHECK(torch::equal(again.tokens, b.tokens));
  CHECK_THROWS_AS(make_random_batch(cfg, 4, 3, 4, 20, 3, 9, 10, &gen, torch::kCPU), std::invalid_argument);
}

TEST_CASE("The recomputable FQNs are the vision tower, its layers, and each joint layer's units", "[model]") {
  Pi05Impl model(Pi05Config::tiny());
  auto fqns = model.recomputable_fqns();
  CHECK(fqns.size() == 1 + 2 + 2 * 7);  // per joint layer: layer, self_attn, mlp (x 2 names), backbone gate+up
  std::set<std::string> set(fqns.begin(), fqns.end());
  CHECK(set.count("paligemma_with_expert.paligemma.model.vision_tower") == 1);
  CHECK(set.count("paligemma_with_expert.paligemma.model.vision_tower.vision_model.encoder.layers.1") == 1);
  CHECK(set.count("paligemma_with_expert.paligemma.model.language_model.layers.0.self_attn") == 1);
  CHECK(set.count("paligemma_with_expert.gemma_expert.model.layers.1.mlp") == 1);
  CHECK(set.count("paligemma_with_expert.paligemma.model.language_model.layers.1.mlp.gate_proj+up_proj") == 1);
  // Every recomputable FQN is a real module, or a merged GEMM's output named as the profiler's GEMM inventory
  // names it (`<module>.<leaf>+<leaf>`, its members Linears of that module).
  std::set<std::string> modules;
  for (const auto& item : model.named_modules("", false)) modules.insert(item.key());
  for (const auto& f : fqns) {
    INFO(f);
    const auto dot = f.rfind('.');
    const std::string leaf = f.substr(dot + 1);
    if (leaf.find('+') == std::string::npos) {
      CHECK(modules.count(f) == 1);
    } else {
      CHECK(leaf == "gate_proj+up_proj");
      CHECK(modules.count(f.substr(0, dot) + ".gate_proj") == 1);
      CHECK(modules.count(f.substr(0, dot) + ".up_proj") == 1);
    }
  }
}
