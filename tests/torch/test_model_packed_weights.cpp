// Packed merged-GEMM weights (model::pack_rows, Pi05Impl::pack_merged_weights): the members of every merged GEMM
// become row slices of one buffer, so kernels::merged_linear reads its stacked weight as a view (no at::cat per
// step), with the same loss and gradients, through the optimizer, EMA and checkpoints. CPU here; the same on CUDA
// bf16 in the [.gpu] case at the end.
#include <ATen/record_function.h>
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include "temp_dir.h"
#include "tiny_train_options.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "formats/recipe.h"
#include "kernels/fused_ops.h"
#include "model/pi05.h"
#include "model/state_dict.h"
#include "trainer/ema.h"
#include "trainer/optimizer.h"
#include "trainer/train_step.h"

namespace {

namespace k = vlatune::kernels;
namespace m = vlatune::model;

// aten::cat calls while armed (a global callback: the backward may run on the autograd engine's device thread).
std::atomic<bool> g_cat_armed{false};
std::atomic<int64_t> g_cats{0};

std::unique_ptr<at::ObserverContext> on_op(const at::RecordFunction& fn) {
  if (g_cat_armed.load(std::memory_order_relaxed) && std::string(fn.name()) == "aten::cat") ++g_cats;
  return nullptr;
}

// Runs fn() and returns the number of aten::cat calls it made.
template <typename Fn>
int64_t count_cats(Fn&& fn) {
  const auto handle = at::addGlobalCallback(at::RecordFunctionCallback(&on_op).scopes({at::RecordScope::FUNCTION}));
  g_cats = 0;
  g_cat_armed = true;
  fn();
  g_cat_armed = false;
  at::removeCallback(handle);
  return g_cats.load();
}

const char* byte_ptr(const torch::Tensor& t) {
  return static_cast<const char*>(t.data_ptr());
}

// Every group of the model: one storage, members adjacent in order, the stack a view starting at the first member.
void check_packed(const m::Pi05Impl& net) {
  REQUIRE(net.merged_weights_packed());
  const auto& layer = *net.language_model().layers.at(0);
  const auto& q = layer.self_attn->q_proj->weight;
  const auto& kk = layer.self_attn->k_proj->weight;
  const auto& v = layer.self_attn->v_proj->weight;
  CHECK(kk.storage().is_alias_of(q.storage()));
  CHECK(v.storage().is_alias_of(q.storage()));
  CHECK(byte_ptr(kk) == byte_ptr(q) + q.numel() * q.element_size());
  CHECK(byte_ptr(v) == byte_ptr(kk) + kk.numel() * kk.element_size());
  const auto stack = k::packed_rows({q, kk, v});
  REQUIRE(stack.defined());
  CHECK(stack.data_ptr() == q.data_ptr());
  CHECK(stack.size(0) == q.size(0) + kk.size(0) + v.size(0));
  const auto kv = k::packed_rows({kk, v});  // the last layer's skipped-prefix group
  REQUIRE(kv.defined());
  CHECK(kv.data_ptr() == kk.data_ptr());
  const auto& siglip = *net.vision_tower().vision_model->encoder->layers.at(0)->self_attn;
  const auto bias = k::packed_rows({siglip.q_proj->bias, siglip.k_proj->bias, siglip.v_proj->bias});
  REQUIRE(bias.defined());
  CHECK(bias.data_ptr() == siglip.q_proj->bias.data_ptr());
}

struct Step {
  torch::Tensor loss;
  std::map<std::string, torch::Tensor> grads;
  int64_t cats = 0;
};

Step fused_step(m::Pi05Impl& net, const m::Pi05Batch& batch, m::Kernels kernels) {
  m::ForwardOptions o;
  o.kernels = kernels;
  net.zero_grad(/*set_to_none=*/true);
  Step s;
  s.cats = count_cats([&] {
    auto out = net.forward(batch, o);
    out.loss.backward();
    s.loss = out.loss.detach();
  });
  net.fill_missing_grads();
  for (const auto& item : net.named_parameters()) s.grads[item.key()] = item.value().grad().detach().clone();
  return s;
}

std::map<std::string, torch::Tensor> state_of(const m::Pi05Impl& net) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : net.named_parameters()) out[item.key()] = item.value().detach().clone();
  return out;
}

std::string temp_dir() {
  return vlatune::test::make_temp_dir("packed");
}

}  // namespace

TEST_CASE("pack_rows makes merged members row slices of one buffer; merged_linear then reads them without a cat",
          "[fused][pack]") {
  torch::manual_seed(3);
  const auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
  const std::vector<torch::Tensor> init_w = {torch::randn({8, 12}, f64), torch::randn({4, 12}, f64),
                                             torch::randn({4, 12}, f64)};
  const std::vector<torch::Tensor> init_b = {torch::randn({8}, f64), torch::randn({4}, f64), torch::randn({4}, f64)};
  const auto x = torch::randn({2, 5, 12}, f64), seed = torch::randn({2, 5, 16}, f64);
  auto make = [](const std::vector<torch::Tensor>& ts) {
    std::vector<torch::Tensor> out;
    for (const auto& t : ts) out.push_back(t.clone().requires_grad_(true));
    return out;
  };
  struct Run {
    torch::Tensor y, dx;
    std::vector<torch::Tensor> dw, db;
    int64_t cats;
  };
  auto run = [&](const std::vector<torch::Tensor>& w, const std::vector<torch::Tensor>& b) {
    Run r;
    auto xi = x.clone().requires_grad_(true);
    r.cats = count_cats([&] {
      r.y = k::merged_linear(xi, w, b);
      (r.y * seed).sum().backward();
    });
    r.dx = xi.grad();
    for (const auto& t : w) r.dw.push_back(t.grad());
    for (const auto& t : b) r.db.push_back(t.grad());
    return r;
  };
  auto w0 = make(init_w), b0 = make(init_b);
  const Run plain = run(w0, b0);
  CHECK(plain.cats == 3);  // weights forward and backward, biases forward

  auto w = make(init_w), b = make(init_b);
  CHECK_FALSE(k::packed_rows(w).defined());
  REQUIRE(m::pack_rows(w));
  REQUIRE(m::pack_rows(b));
  CHECK_FALSE(m::pack_rows(w));  // already packed
  for (size_t i = 0; i < w.size(); ++i) {
    CHECK(w[i].requires_grad());
    CHECK(w[i].is_leaf());
    CHECK(w[i].storage().is_alias_of(w[0].storage()));
    CHECK(torch::equal(w[i], init_w[i]));
    CHECK(torch::equal(b[i], init_b[i]));
  }
  CHECK(k::packed_rows(w).data_ptr() == w[0].data_ptr());
  CHECK(k::packed_rows({w[1], w[2]}).data_ptr() == w[1].data_ptr());
  CHECK_FALSE(k::packed_rows({w[0], w[2]}).defined());  // not adjacent
  CHECK_FALSE(k::packed_rows({w[1], w[0]}).defined());  // out of order

  const Run packed = run(w, b);
  CHECK(packed.cats == 0);
  CHECK(torch::equal(packed.y, plain.y));
  CHECK(torch::equal(packed.dx, plain.dx));
  for (size_t i = 0; i < w.size(); ++i) {
    CHECK(torch::equal(packed.dw[i], plain.dw[i]));
    CHECK(torch::equal(packed.db[i], plain.db[i]));
    CHECK_FALSE(packed.dw[i].storage().is_alias_of(w[0].storage()));  // gradients stay tensors of their own
  }
  // Members out of order, or a subset skipping one, fall back to the cat with the same values.
  const Run swapped = run({w[2], w[1], w[0]}, {});
  CHECK(swapped.cats == 2);
  CHECK(torch::equal(swapped.y, at::linear(x, at::cat({init_w[2], init_w[1], init_w[0]}, 0))));

  CHECK_THROWS_AS(m::pack_rows({torch::zeros({2, 3}), torch::zeros({2, 4})}), std::invalid_argument);
  CHECK_THROWS_AS(m::pack_rows({torch::zeros({2, 3}), torch::zeros({2, 3}, torch::kFloat64)}), std::invalid_argument);
}

TEST_CASE(
    "Packed tiny Pi0.5 on the CPU has one buffer per merged group and a bit-identical fused path without its cats",
    "[fused][pack][model]") {
  const auto cfg = m::Pi05Config::tiny();
  m::Pi05 plain(cfg, torch::kCPU, torch::kFloat32), packed(cfg, torch::kCPU, torch::kFloat32);
  m::init_weights(*plain, 11);
  m::init_weights(*packed, 11);
  const auto before = state_of(*packed);
  CHECK_FALSE(packed->merged_weights_packed());
  // Per SigLIP layer q/k/v weights and biases, per decoder layer and branch q/k/v and gate/up.
  const int64_t groups = 2 * cfg.vision.depth + 2 * (cfg.backbone.depth + cfg.expert.depth);
  CHECK(packed->pack_merged_weights() == groups);
  CHECK(packed->pack_merged_weights() == 0);
  check_packed(*packed);
  // Names, shapes and values unchanged.
  const auto after = state_of(*packed);
  REQUIRE(after.size() == before.size());
  for (const auto& [name, t] : before) {
    INFO(name);
    REQUIRE(after.count(name) == 1);
    CHECK(torch::equal(after.at(name), t));
  }

  torch::Generator gen = at::detail::createCPUGenerator(5);
  const auto batch = m::make_random_batch(cfg, 3, 3, 2, 24, 3, 20, 5, &gen, torch::kCPU);
  const Step ref = fused_step(*plain, batch, m::Kernels::kFused);
  const Step got = fused_step(*packed, batch, m::Kernels::kFused);
  INFO("aten::cat per fused step: unpacked " << ref.cats << ", packed " << got.cats);
  // Per SigLIP layer 3 cats (weights forward and backward, biases forward), per decoder GEMM group 2; the last
  // prefix layer runs only its k/v GEMM (no MLP).
  const int64_t merged_cats = 3 * cfg.vision.depth + 4 * (cfg.backbone.depth + cfg.expert.depth) - 2;
  CHECK(ref.cats - got.cats == merged_cats);
  CHECK(torch::equal(got.loss, ref.loss));
  for (const auto& [name, g] : ref.grads) {
    INFO(name);
    CHECK(torch::equal(got.grads.at(name), g));
  }
  // fp32-master precision (fp32 parameters, bf16 compute): the packed stack is cast once, to the same values.
  {
    m::ForwardOptions o;
    o.kernels = m::Kernels::kFused;
    o.compute_dtype = torch::kBFloat16;
    torch::Tensor losses[2];
    int64_t cats[2];
    int i = 0;
    for (m::Pi05Impl* net : {plain.get(), packed.get()}) {
      net->zero_grad(/*set_to_none=*/true);
      cats[i] = count_cats([&] {
        auto out = net->forward(batch, o);
        out.loss.backward();
        losses[i] = out.loss.detach();
      });
      ++i;
    }
    CHECK(cats[0] - cats[1] == merged_cats);
    CHECK(torch::equal(losses[1], losses[0]));
    for (const auto& item : packed->named_parameters()) {
      INFO(item.key());
      const auto& g = item.value().grad();
      const auto& g0 = plain->named_parameters()[item.key()].grad();
      REQUIRE(g.defined() == g0.defined());
      if (g.defined()) CHECK(torch::equal(g, g0));
    }
  }
  // The reference path (unfused modules) reads the members as they are.
  const Step ref_path = fused_step(*packed, batch, m::Kernels::kReference);
  CHECK(torch::equal(ref_path.loss, fused_step(*plain, batch, m::Kernels::kReference).loss));
}

TEST_CASE("Packed tiny Pi0.5 on the CPU under activation recompute gives the same loss and gradients",
          "[fused][pack][model]") {
  const auto cfg = m::Pi05Config::tiny();
  m::Pi05 plain(cfg, torch::kCPU, torch::kFloat32), packed(cfg, torch::kCPU, torch::kFloat32);
  m::init_weights(*plain, 4);
  m::init_weights(*packed, 4);
  packed->pack_merged_weights();
  const std::vector<std::string> selection = {
      "paligemma_with_expert.paligemma.model.vision_tower.vision_model.encoder.layers.0",
      "paligemma_with_expert.paligemma.model.language_model.layers.0.self_attn",
      "paligemma_with_expert.gemma_expert.model.layers.0.mlp",
      "paligemma_with_expert.paligemma.model.language_model.layers.1"};
  plain->set_recompute(selection);
  packed->set_recompute(selection);
  torch::Generator gen = at::detail::createCPUGenerator(8);
  const auto batch = m::make_random_batch(cfg, 2, 3, 2, 24, 3, 20, 5, &gen, torch::kCPU);
  const Step ref = fused_step(*plain, batch, m::Kernels::kFused);
  const Step got = fused_step(*packed, batch, m::Kernels::kFused);
  INFO("aten::cat per fused step: unpacked " << ref.cats << ", packed " << got.cats);
  CHECK(got.cats < ref.cats);
  CHECK(torch::equal(got.loss, ref.loss));
  for (const auto& [name, g] : ref.grads) {
    INFO(name);
    CHECK(torch::equal(got.grads.at(name), g));
  }
  check_packed(*packed);
}

TEST_CASE("Packed weights stay packed through AdamW and EMA and a checkpoint save and load", "[pack][model][train]") {
  const auto cfg = m::Pi05Config::tiny();
  m::Pi05 net(cfg, torch::kCPU, torch::kFloat32), plain(cfg, torch::kCPU, torch::kFloat32);
  m::init_weights(*net, 2);
  m::init_weights(*plain, 2);
  net->pack_merged_weights();
  std::vector<std::pair<std::string, torch::Tensor>> named, named_plain;
  for (const auto& item : net->named_parameters()) named.emplace_back(item.key(), item.value());
  for (const auto& item : plain->named_parameters()) named_plain.emplace_back(item.key(), item.value());
  vlatune::trainer::AdamWOptions adam;
  adam.lr = 1e-2;
  vlatune::trainer::AdamW opt(named, adam), opt_plain(named_plain, adam);
  vlatune::trainer::Ema ema(named, 0.5);
  torch::Generator gen = at::detail::createCPUGenerator(9);
  const auto batch = m::make_random_batch(cfg, 2, 3, 2, 24, 3, 20, 5, &gen, torch::kCPU);
  for (int step = 0; step < 2; ++step) {
    fused_step(*net, batch, m::Kernels::kFused);
    fused_step(*plain, batch, m::Kernels::kFused);
    opt.step(1e-2, 1.0);
    opt_plain.step(1e-2, 1.0);
    ema.update();
  }
  check_packed(*net);
  const auto trained = state_of(*net);
  for (const auto& [name, t] : state_of(*plain)) {
    INFO(name);
    CHECK(torch::equal(trained.at(name), t));  // the same update, packed or not
  }
  ema.apply_to_params();  // copies into the parameters
  check_packed(*net);
  const auto averaged = state_of(*net);

  const std::string dir = temp_dir();
  const std::string path = dir + "/model.safetensors";
  m::save_state_dict(*net, path);
  m::Pi05 loaded(cfg, torch::kCPU, torch::kFloat32);
  m::init_weights(*loaded, 77);
  loaded->pack_merged_weights();
  m::load_state_dict(*loaded, path, /*strict=*/true);
  check_packed(*loaded);
  // And an unpacked model reads the same file to the same values (the file holds one tensor per FQN).
  m::Pi05 unpacked(cfg, torch::kCPU, torch::kFloat32);
  m::load_state_dict(*unpacked, path, /*strict=*/true);
  const auto from_packed = state_of(*loaded), from_plain = state_of(*unpacked);
  for (const auto& [name, t] : averaged) {
    INFO(name);
    CHECK(torch::equal(from_packed.at(name), t));
    CHECK(torch::equal(from_plain.at(name), t));
  }
  const int rc = std::system(("rm -rf " + dir).c_str());
  (void)rc;
}

TEST_CASE("build_training_parts packs the merged weights", "[pack][train]") {
  // Only the parts are built: no run directory is written.
  const auto o = vlatune::test::tiny_train_options(/*out=*/"", /*steps=*/1);
  std::ostringstream log;
  vlatune::trainer::TrainingParts parts =
      vlatune::trainer::build_training_parts(o, vlatune::formats::Recipe{}, "test", /*load_init_weights=*/true, log);
  check_packed(*parts.net);
  for (const auto& [name, p] : parts.named_params) {
    INFO(name);
    bool found = false;
    for (const auto& item : parts.net->named_parameters())
      if (item.key() == name) found = item.value().is_same(p);
    CHECK(found);  // the optimizer holds the packed parameters themselves
  }
}

TEST_CASE(
    "Packed Pi0.5 on CUDA bf16 reads merged weights as views with the reference loss and gradients and "
    "stays packed through AdamW and a checkpoint",
    "[.gpu][pack][model]") {
  REQUIRE(torch::cuda::is_available());
  const auto cfg = m::Pi05Config::tiny();
  m::Pi05 cpu(cfg, torch::kCPU, torch::kFloat32);
  m::init_weights(*cpu, 11);
  const std::string dir = temp_dir();
  m::save_state_dict(*cpu, dir + "/init.safetensors");
  m::Pi05 plain(cfg, torch::kCUDA, torch::kBFloat16), packed(cfg, torch::kCUDA, torch::kBFloat16);
  m::load_state_dict(*plain, dir + "/init.safetensors");
  m::load_state_dict(*packed, dir + "/init.safetensors");
  packed->pack_merged_weights();
  check_packed(*packed);

  torch::Generator gen = at::detail::createCPUGenerator(5);
  const auto batch = m::make_random_batch(cfg, 3, 3, 2, 24, 3, 20, 5, &gen, torch::kCUDA);
  const Step ref = fused_step(*plain, batch, m::Kernels::kAuto);
  const Step got = fused_step(*packed, batch, m::Kernels::kAuto);
  torch::cuda::synchronize();
  const int64_t merged_cats = 3 * cfg.vision.depth + 4 * (cfg.backbone.depth + cfg.expert.depth) - 2;
  INFO("aten::cat per step: unpacked " << ref.cats << ", packed " << got.cats);
  CHECK(ref.cats - got.cats == merged_cats);
  // Same values, shapes and strides into the same GEMMs: equal unless cuBLAS picks another algorithm for the
  // different pointer alignment of a view; then within bf16 rounding.
  bool bitwise = torch::equal(got.loss, ref.loss);
  const double loss_rel = (got.loss.to(torch::kFloat64) - ref.loss.to(torch::kFloat64)).abs().item<double>() /
                          std::max(1e-30, ref.loss.to(torch::kFloat64).abs().item<double>());
  CHECK(loss_rel < 1e-2);
  double largest = 0;
  for (const auto& [name, g] : ref.grads) largest = std::max(largest, g.to(torch::kFloat64).abs().max().item<double>());
  for (const auto& [name, g] : ref.grads) {
    INFO(name);
    const auto& f = got.grads.at(name);
    bitwise = bitwise && torch::equal(f, g);
    CHECK((f.to(torch::kFloat64) - g.to(torch::kFloat64)).abs().max().item<double>() <= 2e-2 * largest);
  }
  std::printf("packed vs unpacked (tiny, CUDA bf16): bitwise equal %s, loss rel %.2e, cats %lld -> %lld\n",
              bitwise ? "yes" : "no", loss_rel, static_cast<long long>(ref.cats), static_cast<long long>(got.cats));

  std::vector<std::pair<std::string, torch::Tensor>> named;
  for (const auto& item : packed->named_parameters()) named.emplace_back(item.key(), item.value());
  const auto before = state_of(*packed);
  for (auto precision :
       {vlatune::trainer::OptimizerPrecision::kBf16, vlatune::trainer::OptimizerPrecision::kFp32Master}) {
    vlatune::trainer::AdamWOptions adam;
    adam.precision = precision;
    vlatune::trainer::AdamW opt(named, adam);
    fused_step(*packed, batch, m::Kernels::kAuto);
    opt.step(1e-2, 1.0);
    torch::cuda::synchronize();
    check_packed(*packed);
  }
  const auto& q = packed->language_model().layers.at(0)->self_attn->q_proj->weight;
  CHECK_FALSE(torch::equal(q.detach(), before.at(packed->language_model().layers.at(0)->self_attn->q_proj->fqn() +
                                                 ".weight")));  // the step wrote through the views

  m::save_state_dict(*packed, dir + "/trained.safetensors");
  m::Pi05 loaded(cfg, torch::kCUDA, torch::kBFloat16);
  loaded->pack_merged_weights();
  m::load_state_dict(*loaded, dir + "/trained.safetensors");
  check_packed(*loaded);
  const auto a = state_of(*packed), b = state_of(*loaded);
  for (const auto& [name, t] : a) {
    INFO(name);
    CHECK(torch::equal(b.at(name), t));
  }
  const int rc = std::system(("rm -rf " + dir).c_str());
  (void)rc;
}
