// Pi0.5 numerics on the tiny config: adaRMS, precision casts, lean vs materialized attention, the prefix's
// independence of the suffix, time embedding, finite-difference gradients.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <map>

#include "model/pi05.h"

using namespace vlatune::model;

namespace {

Pi05Batch numerics_batch(uint64_t seed, c10::ScalarType dtype) {
  torch::Generator gen = at::globalContext().defaultGenerator(torch::kCPU).clone();
  gen.set_current_seed(seed);
  auto b = make_random_batch(Pi05Config::tiny(), /*batch=*/2, /*slots=*/3, /*valid_slots=*/2, /*text_len=*/12,
                             /*min_prompt=*/3, /*max_prompt=*/7, /*horizon=*/4, &gen, torch::kCPU);
  b.image_masks[1][1] = false;  // one camera missing for one sample only: masked keys inside a kept slot
  return batch_to(b, dtype);
}

double rel_diff(const torch::Tensor& a, const torch::Tensor& b) {
  double denom = std::max(b.abs().max().item<double>(), 1e-300);
  return (a - b).abs().max().item<double>() / denom;
}

std::map<std::string, torch::Tensor> grads_of(Pi05Impl& model) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : model.named_parameters()) out[item.key()] = item.value().grad().clone();
  return out;
}

std::pair<torch::Tensor, std::map<std::string, torch::Tensor>> loss_and_grads(Pi05Impl& model, const Pi05Batch& b,
                                                                              const ForwardOptions& options) {
  model.zero_grad(/*set_to_none=*/true);
  auto out = model.forward(b, options);
  out.loss.backward();
  model.fill_missing_grads();
  return {out.loss.detach(), grads_of(model)};
}

}  // namespace

TEST_CASE("adaRMS with zero dense weights and bias is plain RMS normalization with gate 0", "[model]") {
  AdaRMSNorm norm(16, 8, 1e-6, torch::TensorOptions().dtype(torch::kFloat64));
  auto x = torch::randn({3, 5, 16}, torch::kFloat64);
  auto c = torch::randn({3, 8}, torch::kFloat64);
  auto out = norm->forward(x, c);
  auto expected = x / torch::sqrt(x.pow(2).mean(-1, true) + 1e-6);
  CHECK(rel_diff(out.y, expected) < 1e-14);
  CHECK(out.gate.sizes() == torch::IntArrayRef({3, 1, 16}));
  CHECK(out.gate.abs().max().item<double>() == 0.0);
  // Scale and shift: dense bias [scale | shift | gate].
  {
    torch::NoGradGuard ng;
    norm->dense->bias.narrow(0, 0, 16).fill_(0.5);
    norm->dense->bias.narrow(0, 16, 16).fill_(-2.0);
    norm->dense->bias.narrow(0, 32, 16).fill_(3.0);
  }
  out = norm->forward(x, c);
  CHECK(rel_diff(out.y, expected * 1.5 - 2.0) < 1e-14);
  CHECK(out.gate.min().item<double>() == 3.0);
}

TEST_CASE("RMSNorm scales by 1 + w with fp32 statistics and returns the input dtype", "[model]") {
  RMSNorm norm(8, 1e-6, torch::TensorOptions().dtype(torch::kFloat32));
  {
    torch::NoGradGuard ng;
    norm->weight.fill_(0.25);
  }
  auto x = torch::randn({2, 3, 8});
  auto y = norm(x.to(torch::kBFloat16)).y;
  CHECK(y.scalar_type() == torch::kBFloat16);
  auto expected = x.to(torch::kBFloat16).to(torch::kFloat32);
  expected = expected / torch::sqrt(expected.pow(2).mean(-1, true) + 1e-6) * 1.25;
  CHECK(rel_diff(y.to(torch::kFloat32), expected) < 1e-2);
}

TEST_CASE("A Linear casts its fp32 weight to a bf16 input and returns fp32 weight gradients", "[model]") {
  Linear lin(8, 4, true, torch::TensorOptions().dtype(torch::kFloat32));
  {
    torch::NoGradGuard ng;
    lin->weight.normal_();
    lin->bias.normal_();
  }
  auto x = torch::randn({5, 8}).to(torch::kBFloat16);
  auto y = lin(x);
  CHECK(y.scalar_type() == torch::kBFloat16);
  y.to(torch::kFloat32).sum().backward();
  REQUIRE(lin->weight.grad().defined());
  CHECK(lin->weight.grad().scalar_type() == torch::kFloat32);
  auto ref = torch::matmul(x.to(torch::kFloat32), lin->weight.t()) + lin->bias;
  CHECK(rel_diff(y.to(torch::kFloat32), ref) < 2e-2);
}

TEST_CASE("The time embedding puts sines first with periods from 4e-3 to 4", "[model]") {
  auto t = torch::tensor({0.3, 0.9}, torch::kFloat64);
  auto e = time_embedding(t, 8);
  REQUIRE(e.sizes() == torch::IntArrayRef({2, 8}));
  for (int k = 0; k < 4; ++k) {
    const double period = 4e-3 * std::pow(1000.0, k / 3.0);
    const double angle = 0.9 * 2 * M_PI / period;
    CHECK(e[1][k].item<double>() == Approx(std::sin(angle)).margin(1e-12));
    CHECK(e[1][4 + k].item<double>() == Approx(std::cos(angle)).margin(1e-12));
  }
}

TEST_CASE("Lean (SDPA, grouped KV) and materialized attention agree on loss and gradients", "[model]") {
  for (auto dtype : {torch::kFloat64, torch::kFloat32}) {
    INFO("dtype " << c10::toString(dtype));
    Pi05Impl model(Pi05Config::tiny(), torch::kCPU, dtype);
    init_weights(model, 11);
    auto b = numerics_batch(3, dtype);
    ForwardOptions lean, mat;
    mat.attention = Attention::kMaterialized;
    auto [loss_l, grads_l] = loss_and_grads(model, b, lean);
    auto [loss_m, grads_m] = loss_and_grads(model, b, mat);
    const double tol_loss = dtype == torch::kFloat64 ? 1e-12 : 1e-5;
    const double tol_grad = dtype == torch::kFloat64 ? 1e-10 : 1e-5;
    CHECK(rel_diff(loss_l, loss_m) < tol_loss);
    double largest = 0.0;
    for (const auto& item : grads_m) largest = std::max(largest, item.second.abs().max().item<double>());
    for (const auto& [name, g] : grads_m) {
      INFO(name);
      if (name.find("self_attn.k_proj.bias") != std::string::npos) {
        // Exactly zero in exact arithmetic (softmax ignores the per-row constant q.b): noise only.
        CHECK(grads_l[name].abs().max().item<double>() <= tol_grad * largest);
        continue;
      }
      CHECK(rel_diff(grads_l[name], g) < tol_grad);
    }
  }
}

TEST_CASE("Changing the actions leaves the prefix hidden states of every layer unchanged", "[model]") {
  Pi05Impl model(Pi05Config::tiny(), torch::kCPU, torch::kFloat64);
  init_weights(model, 5);
  auto b = numerics_batch(9, torch::kFloat64);
  for (auto mode : {Attention::kLean, Attention::kMaterialized}) {
    ForwardOptions options;
    options.keep_prefix_states = true;
    options.skip_dead = false;
    options.attention = mode;
    auto b2 = b;
    b2.actions = torch::randn_like(b.actions);
    b2.noise = torch::randn_like(b.noise);
    b2.time = torch::rand_like(b.time);
    torch::NoGradGuard ng;
    auto o1 = model.forward(b, options);
    auto o2 = model.forward(b2, options);
    REQUIRE(o1.prefix_states.size() == 3);  // input of layers 0, 1 and output of layer 1
    CHECK_FALSE(torch::allclose(o1.velocity, o2.velocity));
    for (size_t i = 0; i < o1.prefix_states.size(); ++i) {
      INFO("layer " << i);
      CHECK(torch::equal(o1.prefix_states[i], o2.prefix_states[i]));
    }
  }
}

TEST_CASE("Autograd gradients match float64 finite differences", "[model]") {
  Pi05Impl model(Pi05Config::tiny(), torch::kCPU, torch::kFloat64);
  init_weights(model, 21);
  auto b = numerics_batch(4, torch::kFloat64);
  ForwardOptions options;
  auto [loss, grads] = loss_and_grads(model, b, options);
  auto params = model.named_parameters();
  const std::vector<std::pair<std::string, std::vector<int64_t>>> probes = {
      {"action_out_proj.weight", {3, 7}},
      {"time_mlp_in.weight", {5, 20}},
      {"paligemma_with_expert.paligemma.model.language_model.layers.0.self_attn.q_proj.weight", {9, 4}},
      {"paligemma_with_expert.paligemma.model.language_model.layers.1.self_attn.k_proj.weight", {2, 11}},
      {"paligemma_with_expert.paligemma.model.vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight", {6, 2}},
      {"paligemma_with_expert.gemma_expert.model.layers.0.input_layernorm.dense.weight", {40, 3}},
      {"paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight", {b.tokens[0][0].item<int64_t>(), 5}},
  };
  torch::NoGradGuard ng;
  for (const auto& [name, index] : probes) {
    INFO(name);
    torch::Tensor p = params[name];
    auto element = p.index({index[0], index[1]});
    const double original = element.item<double>();
    const double h = 1e-5;
    element.fill_(original + h);
    const double up = model.forward(b, options).loss.item<double>();
    element.fill_(original - h);
    const double down = model.forward(b, options).loss.item<double>();
    element.fill_(original);
    const double fd = (up - down) / (2 * h);
    const double ad = grads[name].index({index[0], index[1]}).item<double>();
    CHECK(ad == Approx(fd).epsilon(1e-6).margin(1e-10));
  }
}

TEST_CASE("fp32 parameters with bf16 compute give a finite loss close to the fp32 loss", "[model]") {
  Pi05Impl model(Pi05Config::tiny(), torch::kCPU, torch::kFloat32);
  init_weights(model, 2);
  auto b = numerics_batch(6, torch::kFloat32);
  ForwardOptions fp32, bf16;
  bf16.compute_dtype = torch::kBFloat16;
  auto out32 = model.forward(b, fp32);
  auto out16 = model.forward(b, bf16);
  CHECK(out16.velocity.scalar_type() == torch::kFloat32);
  CHECK(std::isfinite(out16.loss.item<double>()));
  CHECK(rel_diff(out16.loss, out32.loss) < 5e-2);
  out16.loss.backward();
  for (const auto& item : model.named_parameters()) {
    INFO(item.key());
    if (item.value().grad().defined()) {
      CHECK(item.value().grad().scalar_type() == torch::kFloat32);
      CHECK(torch::isfinite(item.value().grad()).all().item<bool>());
    }
  }
}

TEST_CASE("The loss can be restricted to the real action dims", "[model]") {
  Pi05Impl model(Pi05Config::tiny(), torch::kCPU, torch::kFloat64);
  init_weights(model, 8);
  auto b = numerics_batch(1, torch::kFloat64);
  ForwardOptions all, seven;
  seven.loss_action_dim = 7;
  torch::NoGradGuard ng;
  auto o_all = model.forward(b, all);
  auto o7 = model.forward(b, seven);
  auto u = b.noise - b.actions;
  CHECK(o_all.loss.item<double>() == Approx((o_all.velocity - u).pow(2).mean().item<double>()).epsilon(1e-12));
  CHECK(o7.loss.item<double>() ==
        Approx((o7.velocity - u).narrow(-1, 0, 7).pow(2).mean().item<double>()).epsilon(1e-12));
  seven.loss_action_dim = 33;
  CHECK_THROWS_AS(model.forward(b, seven), std::invalid_argument);
}

TEST_CASE("live_prefix_rows lists the valid rows, then padded ones up to the multiple, and each row's slot",
          "[model]") {
  // Rows of [2, 4]: sample 0 valid at 0, 1; sample 1 valid at 4, 6 (row 5 padded inside, row 7 after).
  const auto valid = torch::tensor({1, 1, 0, 0, 1, 0, 1, 0}, torch::kBool).view({2, 4});
  const LivePrefixRows exact = live_prefix_rows(valid, 1);
  REQUIRE(exact.rows.defined());
  CHECK(torch::equal(exact.rows, torch::tensor({0, 1, 4, 6}, torch::kLong)));
  // Every row's place in the order valid-then-padded: the live ones (< 4) invert `rows`.
  CHECK(torch::equal(exact.slots, torch::tensor({0, 1, 4, 5, 2, 6, 3, 7}, torch::kLong)));
  const LivePrefixRows tiles = live_prefix_rows(valid, 3);  // 4 valid -> 6 rows: the first two padded ones added
  REQUIRE(tiles.rows.defined());
  CHECK(torch::equal(tiles.rows, torch::tensor({0, 1, 4, 6, 2, 3}, torch::kLong)));
  CHECK(torch::equal(tiles.slots.index_select(0, tiles.rows), torch::arange(6, torch::kLong)));
  CHECK_FALSE(live_prefix_rows(valid, 8).rows.defined());  // rounding up leaves out nothing
  CHECK_FALSE(live_prefix_rows(torch::ones({2, 4}, torch::kBool), 1).rows.defined());
  CHECK_THROWS_WITH(live_prefix_rows(valid, 0), Catch::Contains("multiple must be positive, got 0"));
  CHECK_THROWS_WITH(live_prefix_rows(valid.to(torch::kLong), 1), Catch::Contains("[B, P] bool"));
  CHECK(torch::equal(live_prefix_rows(valid, 1, 4).rows, exact.rows));  // the count given: nothing read back
  CHECK_THROWS_WITH(live_prefix_rows(valid, 1, 9), Catch::Contains("valid_count 9 is outside [0, 8]"));
}

TEST_CASE("The prefix stream on the live rows only: same loss and gradients, zero on the rows left out", "[model]") {
  const auto kernels = GENERATE(Kernels::kReference, Kernels::kFused);
  const auto dtype = kernels == Kernels::kReference ? torch::kFloat64 : torch::kFloat32;
  const int64_t multiple = GENERATE(1, 8);
  INFO("fused " << (kernels == Kernels::kFused) << ", multiple " << multiple);
  Pi05Impl model(Pi05Config::tiny(), torch::kCPU, dtype);
  init_weights(model, 13);
  auto b = numerics_batch(6, dtype);
  ForwardOptions all_rows, live;
  all_rows.kernels = live.kernels = kernels;
  all_rows.skip_padded_rows = false;
  live.live_row_multiple = multiple;
  auto [loss_all, grads_all] = loss_and_grads(model, b, all_rows);
  auto [loss_live, grads_live] = loss_and_grads(model, b, live);
  const double tol = dtype == torch::kFloat64 ? 1e-12 : 2e-6;
  CHECK(rel_diff(loss_live, loss_all) < tol);
  double largest = 0.0;
  for (const auto& item : grads_all) largest = std::max(largest, item.second.abs().max().item<double>());
  auto check_grads = [&](std::map<std::string, torch::Tensor>& got, const std::map<std::string, torch::Tensor>& want) {
    for (const auto& [name, g] : want) {
      INFO(name);
      if (name.find("self_attn.k_proj.bias") != std::string::npos)  // zero in exact arithmetic: noise only
        CHECK(got[name].abs().max().item<double>() <= tol * largest);
      else
        CHECK(rel_diff(got[name], g) < tol);
    }
  };
  check_grads(grads_live, grads_all);
  // Recomputed (the joint attention, the prefix MLP, its gate+up output, the whole joint layer): the same live rows
  // again.
  const std::string layer0 = "paligemma_with_expert.paligemma.model.language_model.layers.0";
  for (const std::string& unit : {layer0 + ".self_attn", layer0 + ".mlp", layer0 + ".mlp.gate_proj+up_proj", layer0}) {
    INFO("recompute " << unit);
    model.set_recompute({unit});
    auto [loss_r, grads_r] = loss_and_grads(model, b, live);
    CHECK(rel_diff(loss_r, loss_live) < tol);
    check_grads(grads_r, grads_live);
  }
  model.set_recompute({});
  // The counts from the batch's summary (as a loader sets them): the same rows, read from no mask.
  Pi05Batch summarized = b;
  summarized.valid_images = b.image_masks.sum().item<int64_t>();
  summarized.valid_tokens = b.token_masks.sum().item<int64_t>();
  auto [loss_summarized, grads_summarized] = loss_and_grads(model, summarized, live);
  CHECK(torch::equal(loss_summarized, loss_live));
  for (const auto& [name, g] : grads_live) {
    INFO(name);
    CHECK(torch::equal(grads_summarized[name], g));
  }
  summarized.valid_tokens = -1;
  CHECK_THROWS_WITH(model.forward(summarized, live), Catch::Contains("the batch's valid_tokens -1 is outside [0, "));
  summarized.valid_tokens = b.token_masks.sum().item<int64_t>();
  summarized.valid_images = 7;  // 2 samples x 2 kept slots
  CHECK_THROWS_WITH(model.forward(summarized, live), Catch::Contains("the batch's valid_images 7 is outside [0, 4]"));
  // Layer 0's output: equal on the valid rows; the padded rows left out are not computed (shown as zeros).
  all_rows.keep_prefix_states = live.keep_prefix_states = true;
  torch::NoGradGuard no_grad;
  const auto states_all = model.forward(b, all_rows).prefix_states.at(1);
  const auto states_live = model.forward(b, live).prefix_states.at(1);
  // The prefix as the forward assembles it: slot 2 (masked in both samples) pruned, 4 tokens per image, the text.
  const int64_t per_image = 4;
  const auto images = b.image_masks.narrow(1, 0, 2).unsqueeze(-1).expand({2, 2, per_image}).reshape({2, 2 * per_image});
  const auto valid = torch::cat({images, b.token_masks.narrow(1, 0, states_all.size(1) - 2 * per_image)}, 1);
  REQUIRE(valid.sizes() == states_all.sizes().slice(0, 2));
  const auto rows_all = states_all.reshape({-1, states_all.size(-1)});
  const auto rows_live = states_live.reshape({-1, states_live.size(-1)});
  const auto valid_rows = valid.reshape({-1}).nonzero().squeeze(1);
  const auto padded_rows = valid.reshape({-1}).logical_not().nonzero().squeeze(1);
  REQUIRE(padded_rows.size(0) > multiple);  // some padded rows are left out at either multiple
  CHECK(rel_diff(rows_live.index_select(0, valid_rows), rows_all.index_select(0, valid_rows)) < tol);
  const LivePrefixRows kept = live_prefix_rows(valid, multiple);
  REQUIRE(kept.rows.defined());
  const auto left_out = (kept.slots >= kept.rows.size(0)).nonzero().squeeze(1);
  REQUIRE(left_out.size(0) > 0);
  CHECK(torch::equal(rows_live.index_select(0, left_out),
                     torch::zeros({left_out.size(0), rows_live.size(1)}, rows_live.options())));
  CHECK_FALSE(torch::allclose(rows_live.index_select(0, left_out), rows_all.index_select(0, left_out)));
}
