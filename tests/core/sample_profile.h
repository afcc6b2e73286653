// A small profile.json with every section filled (two batches, modules, kernels with sites, recompute A/B, GEMMs
// with and without FP8, overhead): the round-trip document of the profile tests and a seed of the fuzz test.
#pragma once

#include <cstdint>

#include "formats/profile.h"
#include "formats/recipe.h"

namespace vlatune::test {

inline vlatune::formats::BatchProfile sample_batch(int64_t batch) {
  vlatune::formats::BatchProfile b;
  b.batch = batch;
  b.step_ms = 700.0 * static_cast<double>(batch) / 32.0;
  b.step_ms_samples = {b.step_ms - 1, b.step_ms, b.step_ms + 2};
  b.data_wait_ms = 0.4;
  b.data_wait_ms_samples = {0.3, 0.4, 1.5};
  b.peak_gib = 70.5;
  b.memory.parameter_bytes = 6706867744;
  b.memory.gradient_bytes = 6706867744;
  b.memory.optimizer_bytes = 13413735488;
  b.memory.activation_bytes = int64_t{40} << 30;
  b.memory.peak_gib_by_phase = {{"forward", 60.0}, {"backward", 70.5}, {"optimizer", 30.0}};
  vlatune::formats::ModuleCost layer{"paligemma_with_expert.paligemma.model.language_model.layers.0",
                                     "GemmaDecoderLayer",
                                     10.0,
                                     20.0,
                                     0.0,
                                     1.0,
                                     40,
                                     int64_t{1} << 30,
                                     1 << 20,
                                     200000000,
                                     false};
  vlatune::formats::ModuleCost mlp{"paligemma_with_expert.paligemma.model.language_model.layers.0.mlp",
                                   "GemmaMLP",
                                   6.0,
                                   12.0,
                                   0.0,
                                   0.5,
                                   12,
                                   int64_t{1} << 29,
                                   1 << 20,
                                   150000000,
                                   false};
  vlatune::formats::ModuleCost optimizer{"<optimizer>", "pseudo", 0, 0, 0, 12.0, 30, 0, 0, 0, false};
  b.modules = {layer, mlp, optimizer};
  b.kernels = {{"nvjet_tst_128x256",
                "gemm",
                400,
                450.0,
                {{"paligemma_with_expert.paligemma.model.language_model.layers.0.mlp", "backward", 2, 300.0},
                 {"paligemma_with_expert.paligemma.model.language_model.layers.0.mlp", "forward", 1, 150.0}}},
               {"vlatune_adamw", "optimizer", 30, 12.0, {{"<optimizer>", "optimizer", 30, 12.0}}}};
  b.attribution.gpu_ms = 690;
  b.attribution.attributed_fraction = 0.995;
  b.attribution.dropped_records = 0;
  b.attribution.unattributed = {{"at::native::fill_kernel", "memset", 3, 0.2, {}}};
  b.recompute = {
      {"backbone_mlp", {"paligemma_with_expert.paligemma.model.language_model.layers.*.mlp"}, true, 40.0, -10.0, 4.0}};
  return b;
}

inline vlatune::formats::Profile sample_profile() {
  vlatune::formats::Profile p;
  p.environment.gpu = "NVIDIA H200";
  p.environment.driver = "580.95.05";
  p.environment.cuda = "13.0";
  p.environment.torch = "2.11.0+cu130";
  p.environment.config = "full";
  p.environment.recipe_hash = vlatune::formats::recipe_hash(vlatune::formats::Recipe{});
  p.settings.device = "cuda";
  p.settings.tracer = "cupti";
  p.settings.steps = 4;
  p.settings.warmup = 2;
  p.settings.gpu_memory_gib = 139.8;
  p.recipe.recompute.modules = {"paligemma_with_expert.paligemma.model.vision_tower.vision_model.encoder.layers.*"};
  p.recomputable = {"paligemma_with_expert.paligemma.model.language_model.layers.0",
                    "paligemma_with_expert.paligemma.model.language_model.layers.0.mlp"};
  p.batches = {sample_batch(32), sample_batch(16)};
  vlatune::formats::GemmEntry qkv;
  qkv.name = "paligemma_with_expert.paligemma.model.language_model.layers.0.self_attn.qkv";
  qkv.members = {"paligemma_with_expert.paligemma.model.language_model.layers.0.self_attn.q_proj",
                 "paligemma_with_expert.paligemma.model.language_model.layers.0.self_attn.k_proj",
                 "paligemma_with_expert.paligemma.model.language_model.layers.0.self_attn.v_proj"};
  qkv.m = 32 * 712;
  qkv.k = 2048;
  qkv.n = 2560;
  qkv.bf16 = {0.5, 0.5, 0.6};
  qkv.fp8 = vlatune::formats::GemmTimes{0.3, 0.3, 0.35};
  qkv.quant_ms = 0.05;
  vlatune::formats::GemmEntry action;
  action.name = action.members.emplace_back("action_out_proj");
  action.m = 32 * 50;
  action.k = 1024;
  action.n = 32;
  action.bf16 = {0.01, 0.01, 0.01};
  p.gemms = {qkv, action};
  p.overhead = vlatune::formats::Overhead{700.0, 712.0};
  return p;
}

}  // namespace vlatune::test
