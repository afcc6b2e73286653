// LoRA adapters and freezing on the tiny Pi0.5 (model/lora.h): a fresh adapter leaves the model as it was, the
// fused path and the reference path agree with adapters (training and sampling), frozen weights get no gradient through
// the kernels' nodes, the merged export equals base + (alpha / rank) B A and loads back, the adapters file round-trips
// and its reader refuses bad files; on the GPU ([.gpu]), the CUDA kernels with adapters and frozen Linears against the
// fp64 reference.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <map>
#include <string>
#include <vector>

#include "formats/json_error.h"
#include "model/lora.h"
#include "model/pi05.h"
#include "model/safetensors_io.h"
#include "model/sample.h"
#include "model/state_dict.h"
#include "temp_dir.h"

namespace m = vlatune::model;

namespace {

const std::string kLm = "paligemma_with_expert.paligemma.model.language_model.layers.";
const std::string kEx = "paligemma_with_expert.gemma_expert.model.layers.";
const std::string kVit = "paligemma_with_expert.paligemma.model.vision_tower.vision_model.encoder.layers.";

// Adapters on every kind of Linear path: merged q/k/v (one member only, and all three), gate/up, down_proj (the
// GeGLU node), o_proj, SigLIP q/k/v and fc2 (the GELU node), a head.
std::vector<m::LoraSpec> every_path(int64_t rank) {
  return {{kVit + "0.self_attn.k_proj", rank, 2.0}, {kVit + "1.mlp.fc2", rank, 3.0},
          {kLm + "0.self_attn.q_proj", rank, 8.0},  {kLm + "0.self_attn.k_proj", rank, 8.0},
          {kLm + "0.self_attn.v_proj", rank, 8.0},  {kLm + "0.self_attn.o_proj", rank, 4.0},
          {kLm + "0.mlp.up_proj", rank, 4.0},       {kLm + "0.mlp.down_proj", rank, 4.0},
          {kEx + "1.self_attn.v_proj", rank, 1.0},  {kEx + "1.mlp.gate_proj", rank, 2.0},
          {kEx + "1.mlp.down_proj", rank, 2.0},     {"action_out_proj", rank, 1.0}};
}

m::Pi05 tiny_model(torch::Dtype dtype = torch::kFloat64) {
  m::Pi05 net(m::Pi05Config::tiny(), torch::kCPU, dtype);
  m::init_weights(*net, 3);
  net->pack_merged_weights();
  return net;
}

m::Pi05Batch tiny_batch(torch::Dtype dtype = torch::kFloat64) {
  torch::Generator gen = at::detail::createCPUGenerator(9);
  return m::batch_to(m::make_random_batch(m::Pi05Config::tiny(), 2, 3, 2, 24, 3, 20, 5, &gen, torch::kCPU), dtype);
}

struct Step {
  torch::Tensor loss, velocity;
  std::map<std::string, torch::Tensor> grads;  // parameters with a gradient
};

Step step(m::Pi05Impl& net, const m::Pi05Batch& batch, m::Kernels kernels) {
  net.zero_grad(/*set_to_none=*/true);
  m::ForwardOptions o;
  o.kernels = kernels;
  auto out = net.forward(batch, o);
  out.loss.backward();
  Step s{out.loss.detach(), out.velocity.detach(), {}};
  for (const auto& item : net.named_parameters())
    if (item.value().grad().defined()) s.grads[item.key()] = item.value().grad().detach().clone();
  return s;
}

// Gives every adapter a non-zero B, so the adapters change the output.
void perturb_b(m::Pi05Impl& net) {
  torch::NoGradGuard no_grad;
  torch::Generator gen = at::detail::createCPUGenerator(17);
  for (const auto& item : net.named_parameters())
    if (item.key().size() > 7 && item.key().substr(item.key().size() - 7) == ".lora_B")
      item.value().normal_(0.0, 0.05, gen);
}

std::map<std::string, torch::Tensor> load_all(const std::string& path) {
  auto f = m::SafetensorsFile::open(path);
  std::map<std::string, torch::Tensor> out;
  for (const auto& e : f.entries()) out[e.name] = f.tensor(e.name);
  return out;
}

}  // namespace

TEST_CASE("A fresh LoRA adapter leaves loss and output exactly the base model's, on both paths", "[model][lora]") {
  const auto batch = tiny_batch();
  for (const m::Kernels kernels : {m::Kernels::kReference, m::Kernels::kFused}) {
    m::Pi05 base = tiny_model(), adapted = tiny_model();
    m::add_lora(*adapted, every_path(4), /*seed=*/1);
    const Step a = step(*base, batch, kernels), b = step(*adapted, batch, kernels);
    CHECK(torch::equal(a.loss, b.loss));
    CHECK(torch::equal(a.velocity, b.velocity));
  }
}

TEST_CASE("LoRA: adapters get gradients, base weights none, and the fused path matches the reference path",
          "[model][lora]") {
  m::Pi05 net = tiny_model();
  m::add_lora(*net, every_path(3), /*seed=*/2);
  perturb_b(*net);
  const auto specs = m::lora_adapters(*net);
  REQUIRE(specs.size() == every_path(3).size());
  const auto batch = tiny_batch();
  const Step ref = step(*net, batch, m::Kernels::kReference);
  const Step fused = step(*net, batch, m::Kernels::kFused);
  CHECK(torch::allclose(ref.loss, fused.loss, 1e-10, 1e-12));
  CHECK(torch::allclose(ref.velocity, fused.velocity, 1e-9, 1e-11));
  for (const auto& spec : specs) {
    INFO(spec.module);
    for (const Step* s : {&ref, &fused}) {
      CHECK(s->grads.count(spec.module + ".weight") == 0);  // frozen: no dW computed
      REQUIRE(s->grads.count(spec.module + ".lora_A") == 1);
      REQUIRE(s->grads.count(spec.module + ".lora_B") == 1);
    }
    CHECK(ref.grads.at(spec.module + ".lora_A").abs().sum().item<double>() > 0);
    for (const char* leaf : {".lora_A", ".lora_B"})
      CHECK(torch::allclose(ref.grads.at(spec.module + leaf), fused.grads.at(spec.module + leaf), 1e-8, 1e-10));
  }
  // SigLIP biases freeze with their Linear.
  CHECK(ref.grads.count(kVit + "1.mlp.fc2.bias") == 0);
  CHECK(ref.grads.count(kVit + "1.mlp.fc1.bias") == 1);
}

TEST_CASE("Sampling with adapters runs them on the fused path as on the reference path", "[model][lora][sample]") {
  m::Pi05 net = tiny_model();
  m::add_lora(*net, every_path(3), /*seed=*/4);
  perturb_b(*net);
  const auto batch = tiny_batch();
  const torch::Tensor noise = m::sample_noise(2, 5, 32, 3).to(torch::kFloat64);
  auto sample = [&](m::Kernels kernels) {
    m::SampleOptions o;
    o.num_steps = 2;
    o.forward.kernels = kernels;
    return m::Sampler(*net, o).sample(batch, noise);
  };
  const torch::Tensor ref = sample(m::Kernels::kReference), fused = sample(m::Kernels::kFused);
  CHECK(torch::allclose(ref, fused, 1e-9, 1e-11));
  m::Pi05 base = tiny_model();  // the same weights without adapters samples something else
  m::SampleOptions o;
  o.num_steps = 2;
  CHECK_FALSE(torch::allclose(m::Sampler(*base, o).sample(batch, noise), ref, 1e-6, 1e-8));
}

TEST_CASE("Frozen weights under the fused GeGLU and GELU nodes get no gradient; every other gradient is unchanged",
          "[model][lora][freeze]") {
  const auto batch = tiny_batch();
  m::Pi05 full = tiny_model(), frozen = tiny_model();
  m::freeze_modules(*frozen, {kLm + "0.mlp.down_proj", kVit + "0.mlp.fc2", kEx + "1.mlp"});
  CHECK_THROWS_WITH(m::freeze_modules(*frozen, {"paligemma_with_expert.nothing"}),
                    Catch::Contains("'paligemma_with_expert.nothing' is not a module"));
  for (const m::Kernels kernels : {m::Kernels::kReference, m::Kernels::kFused}) {
    const Step a = step(*full, batch, kernels), b = step(*frozen, batch, kernels);
    CHECK(torch::equal(a.loss, b.loss));
    for (const std::string& name : {kLm + "0.mlp.down_proj.weight", kVit + "0.mlp.fc2.weight", kVit + "0.mlp.fc2.bias",
                                    kEx + "1.mlp.gate_proj.weight"}) {
      INFO(name);
      CHECK(a.grads.count(name) == 1);
      CHECK(b.grads.count(name) == 0);
    }
    for (const auto& [name, g] : b.grads) {
      INFO(name);
      CHECK(torch::equal(g, a.grads.at(name)));
    }
  }
}

TEST_CASE("add_lora refuses a non-Linear, a second adapter, a rank above the smaller dimension and an FP8 Linear",
          "[model][lora]") {
  m::Pi05 net = tiny_model(torch::kFloat32);
  CHECK_THROWS_WITH(m::add_lora(*net, {{kLm + "0.mlp", 4, 4.0}}, 0), Catch::Contains("is not a Linear"));
  // k_proj of the tiny expert is [16, 32]: rank 17 is one too many.
  CHECK_THROWS_WITH(m::add_lora(*net, {{kEx + "0.self_attn.k_proj", 17, 17.0}}, 0),
                    Catch::Contains("rank 17") && Catch::Contains("[16, 32]") && Catch::Contains("1..16"));
  m::add_lora(*net, {{kEx + "0.self_attn.k_proj", 16, 16.0}}, 0);
  CHECK_THROWS_WITH(m::add_lora(*net, {{kEx + "0.self_attn.k_proj", 4, 4.0}}, 0),
                    Catch::Contains("already has a LoRA adapter"));
  CHECK_THROWS_WITH(net->set_fp8({kEx + "0.self_attn.q_proj"}), Catch::Contains("k_proj' has a LoRA adapter"));
  net->set_fp8({kEx + "1.mlp.gate_proj"});
  CHECK_THROWS_WITH(m::add_lora(*net, {{kEx + "1.mlp.up_proj", 4, 4.0}}, 0), Catch::Contains("runs in FP8"));
}

TEST_CASE("The merged export is base + (alpha / rank) B A under the openpi names and loads back as the same model",
          "[model][lora][export]") {
  vlatune::test::TempDir dir("lora-export");
  m::Pi05 net = tiny_model(torch::kFloat32);
  const auto base = load_all([&] {
    m::save_state_dict(*net, dir.file("base.safetensors"));
    return dir.file("base.safetensors");
  }());
  m::add_lora(*net, every_path(4), /*seed=*/3);
  perturb_b(*net);
  m::save_merged_state_dict(*net, dir.file("merged.safetensors"));
  const auto merged = load_all(dir.file("merged.safetensors"));
  REQUIRE(merged.size() == base.size());  // no adapter tensors
  for (const auto& spec : m::lora_adapters(*net)) {
    INFO(spec.module);
    const auto& l = *dynamic_cast<const m::LinearImpl*>(net->named_modules()[spec.module].get());
    const torch::Tensor expected =
        base.at(spec.module + ".weight") + spec.alpha / static_cast<double>(spec.rank) * at::mm(l.lora_B, l.lora_A);
    CHECK(torch::allclose(merged.at(spec.module + ".weight"), expected, 1e-6, 1e-7));
  }
  CHECK(torch::equal(merged.at("action_in_proj.weight"), base.at("action_in_proj.weight")));

  // The merged weights load with the ordinary strict loader and compute what the LoRA model computes.
  m::Pi05 loaded(m::Pi05Config::tiny(), torch::kCPU, torch::kFloat32);
  CHECK(m::load_state_dict(*loaded, dir.file("merged.safetensors"), /*strict=*/true).ok());
  const auto batch = tiny_batch(torch::kFloat32);
  torch::NoGradGuard no_grad;
  const auto want = net->forward(batch).velocity, got = loaded->forward(batch).velocity;
  CHECK(torch::allclose(got, want, 1e-4, 1e-5));
}

TEST_CASE("The adapters file round-trips into a base model and its reader refuses bad files", "[model][lora][export]") {
  vlatune::test::TempDir dir("lora-adapters");
  m::Pi05 net = tiny_model(torch::kFloat32);
  CHECK_THROWS_WITH(m::save_lora_adapters(*net, dir.file("none.safetensors")), Catch::Contains("no LoRA adapters"));
  m::add_lora(*net, every_path(2), /*seed=*/4);
  perturb_b(*net);
  const std::string path = dir.file("adapters.safetensors");
  m::save_lora_adapters(*net, path);
  const auto file = m::SafetensorsFile::open(path);
  CHECK(file.entries().size() == 2 * every_path(2).size());
  CHECK(file.metadata().at(m::kConfigMetadataKey) == "tiny");

  m::Pi05 other = tiny_model(torch::kFloat32);  // same base weights, no adapters
  const auto specs = m::load_lora_adapters(*other, path);
  REQUIRE(specs.size() == every_path(2).size());
  CHECK(specs[1].module == kVit + "1.mlp.fc2");
  CHECK(specs[1].alpha == 3.0);
  const auto batch = tiny_batch(torch::kFloat32);
  {
    torch::NoGradGuard no_grad;
    CHECK(torch::equal(net->forward(batch).velocity, other->forward(batch).velocity));
  }
  // Loading again into the adapted model is fine (same ranks); a model with another rank refuses.
  CHECK_NOTHROW(m::load_lora_adapters(*other, path));
  m::Pi05 ranked = tiny_model(torch::kFloat32);
  m::add_lora(*ranked, {{"action_out_proj", 3, 1.0}}, 0);
  CHECK_THROWS_WITH(m::load_lora_adapters(*ranked, path), Catch::Contains("'action_out_proj' has rank 2"));

  // Bad files, each refused before the model changes.
  auto write = [&](const std::string& name, const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                   const std::map<std::string, std::string>& meta) {
    m::write_safetensors(dir.file(name), tensors, meta);
    return dir.file(name);
  };
  const torch::Tensor a = torch::zeros({2, 32}), b = torch::zeros({32, 2});
  auto meta = [](const std::string& list) {
    return std::map<std::string, std::string>{
        {m::kLoraMetadataKey, R"({"schema": "vlatune.lora/1", "adapters": )" + list + "}"}};
  };
  const std::string one = R"([{"module": "action_out_proj", "rank": 2, "alpha": 2}])";
  m::Pi05 fresh = tiny_model(torch::kFloat32);
  CHECK_THROWS_WITH(m::load_lora_adapters(*fresh, write("nometa.safetensors", {{"action_out_proj.lora_A", a}}, {})),
                    Catch::Contains("nometa.safetensors") && Catch::Contains("not a LoRA adapters file"));
  CHECK_THROWS_WITH(m::load_lora_adapters(*fresh, write("schema.safetensors", {},
                                                        {{m::kLoraMetadataKey, R"({"schema": "x", "adapters": []})"}})),
                    Catch::Contains("$.schema") && Catch::Contains("vlatune.lora/1"));
  CHECK_THROWS_WITH(
      m::load_lora_adapters(
          *fresh, write("rank0.safetensors", {}, meta(R"([{"module": "action_out_proj", "rank": 0, "alpha": 2}])"))),
      Catch::Contains("$.adapters[0].rank"));
  CHECK_THROWS_WITH(
      m::load_lora_adapters(
          *fresh, write("alpha.safetensors", {}, meta(R"([{"module": "action_out_proj", "rank": 2, "alpha": 0}])"))),
      Catch::Contains("$.adapters[0].alpha"));
  // action_out_proj is [32, 32] in the tiny config: A [2, 32], B [32, 2].
  CHECK_THROWS_WITH(
      m::load_lora_adapters(*fresh, write("missing.safetensors", {{"action_out_proj.lora_A", a}}, meta(one))),
      Catch::Contains("missing tensor 'action_out_proj.lora_B'"));
  CHECK_THROWS_WITH(
      m::load_lora_adapters(*fresh, write("shape.safetensors",
                                          {{"action_out_proj.lora_A", a}, {"action_out_proj.lora_B", a}}, meta(one))),
      Catch::Contains("'action_out_proj.lora_B' is [2, 32], expected [32, 2]"));
  CHECK_THROWS_WITH(
      m::load_lora_adapters(
          *fresh, write("extra.safetensors", {{"action_out_proj.lora_A", a}, {"action_out_proj.lora_B", b}, {"x", a}},
                        meta(one))),
      Catch::Contains("unexpected tensor 'x'"));
  CHECK_THROWS_WITH(m::load_lora_adapters(*fresh, write("module.safetensors", {{"nope.lora_A", a}, {"nope.lora_B", b}},
                                                        meta(R"([{"module": "nope", "rank": 2, "alpha": 2}])"))),
                    Catch::Contains("'nope', which is not a Linear"));
  CHECK(m::lora_adapters(*fresh).empty());
  CHECK_NOTHROW(m::load_lora_adapters(
      *fresh, write("good.safetensors", {{"action_out_proj.lora_A", a}, {"action_out_proj.lora_B", b}}, meta(one))));
  CHECK(m::lora_adapters(*fresh).size() == 1);
}

TEST_CASE(
    "GPU: adapters and frozen Linears through the CUDA kernels match the fp64 reference; frozen weights get "
    "no gradient",
    "[.gpu][model][lora][freeze]") {
  REQUIRE(torch::cuda::is_available());
  const torch::Device cuda(torch::kCUDA, 0);
  const std::vector<std::string> frozen = {kVit + "0.mlp.fc2", kLm + "1.mlp"};  // under the GELU and GeGLU nodes
  m::Pi05 ref = tiny_model();
  m::add_lora(*ref, every_path(3), /*seed=*/2);
  perturb_b(*ref);
  m::freeze_modules(*ref, frozen);
  m::Pi05 gpu(m::Pi05Config::tiny(), cuda, torch::kFloat32);
  gpu->pack_merged_weights();
  m::add_lora(*gpu, every_path(3), /*seed=*/2);
  m::freeze_modules(*gpu, frozen);
  {
    torch::NoGradGuard no_grad;
    auto src = ref->named_parameters();
    for (auto& item : gpu->named_parameters()) item.value().copy_(src[item.key()]);
  }
  m::Pi05Batch batch = m::batch_to(tiny_batch(), torch::kFloat32);
  for (torch::Tensor* t : m::batch_tensors(batch)) *t = t->to(cuda);
  const Step want = step(*ref, tiny_batch(), m::Kernels::kReference);
  const Step got = step(*gpu, batch, m::Kernels::kAuto);
  // fp32 on the GPU (cuDNN may run the patch convolution in TF32) against fp64 on the CPU.
  CHECK(std::abs(got.loss.item<double>() / want.loss.item<double>() - 1) < 2e-3);
  const std::string key_bias = "self_attn.k_proj.bias";
  double largest = 0;  // the largest gradient norm: the scale of the noise
  for (const auto& item : want.grads) largest = std::max(largest, item.second.norm().item<double>());
  for (const auto& [name, g] : want.grads) {
    INFO(name);
    REQUIRE(got.grads.count(name) == 1);
    const torch::Tensor a = g.flatten(), b = got.grads.at(name).cpu().to(torch::kFloat64).flatten();
    if (name.size() > key_bias.size() && name.compare(name.size() - key_bias.size(), key_bias.size(), key_bias) == 0) {
      // A key bias adds one logit to every key of a query row: softmax ignores it, so its exact gradient is zero
      // and both sides hold rounding noise (a cosine of noise means nothing).
      CHECK(b.norm().item<double>() < 1e-4 * largest);
      continue;
    }
    if (a.norm().item<double>() > 0) CHECK(torch::cosine_similarity(a, b, 0).item<double>() > 0.999);
  }
  CHECK(got.grads.size() == want.grads.size());
  for (const std::string& name : {kVit + "0.mlp.fc2.weight", kVit + "0.mlp.fc2.bias", kLm + "1.mlp.down_proj.weight",
                                  kLm + "1.mlp.gate_proj.weight"})
    CHECK(got.grads.count(name) == 0);
}
