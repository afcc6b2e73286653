// Action sampling (model/sample.h): the cached sampler against num_steps uncached joint forwards, the Euler grid
// and updates against the spec's arithmetic, and (GPU) the captured denoising loop against eager sampling.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <cmath>

#include "model/pi05.h"
#include "model/sample.h"
#include "tensor_test_util.h"

using namespace vlatune::model;
using vlatune::test::rel_err;

namespace {

// 3 camera slots, the third masked for the whole batch and the second for one sample; prompts of 3..9 tokens in
// 24 positions; horizon 5.
Pi05Batch sample_batch(uint64_t seed, c10::ScalarType dtype, int64_t batch = 2) {
  torch::Generator gen = at::globalContext().defaultGenerator(torch::kCPU).clone();
  gen.set_current_seed(seed);
  auto b = make_random_batch(Pi05Config::tiny(), batch, /*slots=*/3, /*valid_slots=*/2, /*text_len=*/24,
                             /*min_prompt=*/3, /*max_prompt=*/9, /*horizon=*/5, &gen, torch::kCPU);
  if (batch > 1) b.image_masks[1][1] = false;
  return batch_to(b, dtype);
}

Pi05 tiny_model(c10::ScalarType dtype, uint64_t seed) {
  Pi05 m(Pi05Config::tiny(), torch::kCPU, dtype);
  init_weights(*m, seed);
  return m;
}

double max_abs(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
}

}  // namespace

TEST_CASE("The Euler time grid is openpi's: t from 1 down by 1/num_steps while t >= -dt/2", "[sample]") {
  const std::vector<float> ten = euler_times(10);
  REQUIRE(ten.size() == 10);
  float t = 1.0f;  // fp32 accumulation, as openpi's time tensor
  for (float got : ten) {
    CHECK(got == t);
    t += -0.1f;
  }
  CHECK(std::abs(ten.back() - 0.1f) < 1e-6f);
  CHECK(euler_times(1) == std::vector<float>{1.0f});
  CHECK(euler_times(4) == std::vector<float>{1.0f, 0.75f, 0.5f, 0.25f});
  CHECK_THROWS_WITH(euler_times(0), Catch::Contains("num_steps must be >= 1"));
}

TEST_CASE("Cached sampling equals uncached joint forwards to rounding (fp64, every kernel and attention path)",
          "[sample]") {
  Pi05 net = tiny_model(torch::kFloat64, 11);
  const Pi05Batch b = sample_batch(1, torch::kFloat64);
  const torch::Tensor noise = sample_noise(2, 5, 32, 7).to(torch::kFloat64);
  // The reference keeps every shortcut off and runs the last layer's dead prefix work too.
  ForwardOptions ref_options;
  ref_options.prune_slots = ref_options.trim_text = ref_options.skip_dead = false;
  ref_options.kernels = Kernels::kReference;
  ref_options.attention = Attention::kMaterialized;
  const torch::Tensor ref = sample_actions_uncached(*net, b, noise, 3, ref_options);
  CHECK(rel_err(ref, noise) > 1e-2);  // the model moved the noise
  struct Variant {
    Kernels kernels;
    Attention attention;
    bool shortcuts;
  };
  for (const Variant& v :
       {Variant{Kernels::kReference, Attention::kLean, true},
        Variant{Kernels::kReference, Attention::kMaterialized, true}, Variant{Kernels::kFused, Attention::kLean, true},
        Variant{Kernels::kFused, Attention::kMaterialized, false}}) {
    INFO("kernels " << static_cast<int>(v.kernels) << ", attention " << static_cast<int>(v.attention) << ", shortcuts "
                    << v.shortcuts);
    SampleOptions o;
    o.num_steps = 3;
    o.forward.kernels = v.kernels;
    o.forward.attention = v.attention;
    o.forward.prune_slots = o.forward.trim_text = v.shortcuts;
    const torch::Tensor got = Sampler(*net, o).sample(b, noise);
    REQUIRE(got.sizes() == noise.sizes());
    CHECK(got.scalar_type() == torch::kFloat64);
    CHECK(rel_err(got, ref) < 1e-12);
  }
}

TEST_CASE("Cached sampling equals uncached joint forwards to fp32 rounding (fp32)", "[sample]") {
  Pi05 net = tiny_model(torch::kFloat32, 12);
  const Pi05Batch b = sample_batch(2, torch::kFloat32);
  const torch::Tensor noise = sample_noise(2, 5, 32, 8);
  Sampler sampler(*net);  // openpi's 10 steps
  const torch::Tensor got = sampler.sample(b, noise);
  const torch::Tensor ref = sample_actions_uncached(*net, b, noise, 10);
  CHECK(got.scalar_type() == torch::kFloat32);
  CHECK(rel_err(got, ref) < 2e-6);
  // Same sampler, same inputs: the cached conditioning changes nothing.
  CHECK(torch::equal(sampler.sample(b, noise), got));
}

TEST_CASE("Each sample of a batch is sampled as if alone", "[sample]") {
  Pi05 net = tiny_model(torch::kFloat64, 13);
  const Pi05Batch b = sample_batch(3, torch::kFloat64, 2);
  const torch::Tensor noise = sample_noise(2, 5, 32, 9).to(torch::kFloat64);
  SampleOptions o;
  o.num_steps = 2;
  Sampler sampler(*net, o);
  const torch::Tensor both = sampler.sample(b, noise);
  for (int64_t i = 0; i < 2; ++i) {
    Pi05Batch one;
    one.images = b.images.narrow(0, i, 1);
    one.image_masks = b.image_masks.narrow(0, i, 1);
    one.tokens = b.tokens.narrow(0, i, 1);
    one.token_masks = b.token_masks.narrow(0, i, 1);
    CHECK(rel_err(sampler.sample(one, noise.narrow(0, i, 1)), both.narrow(0, i, 1)) < 1e-12);
  }
}

TEST_CASE("A constant velocity field moves the noise by exactly minus that velocity over the Euler steps", "[sample]") {
  // action_out_proj = 0 * h + c: v = c everywhere, so x_0 = eps + sum_k dt * c = eps - c (spec §7.2).
  Pi05 net = tiny_model(torch::kFloat64, 14);
  {
    torch::NoGradGuard no_grad;
    net->action_out_proj->weight.zero_();
    net->action_out_proj->bias.copy_(torch::linspace(-2.0, 3.0, 32, torch::kFloat64));
  }
  const Pi05Batch b = sample_batch(4, torch::kFloat64);
  const torch::Tensor noise = sample_noise(2, 5, 32, 10).to(torch::kFloat64);
  for (int64_t steps : {1, 4, 10}) {
    INFO(steps << " steps");
    SampleOptions o;
    o.num_steps = steps;
    const torch::Tensor got = Sampler(*net, o).sample(b, noise);
    const torch::Tensor expected = noise - net->action_out_proj->bias.view({1, 1, 32});
    // dt = -1/steps in fp32 (openpi), so the sum of the steps is -1 to fp32 rounding.
    CHECK(max_abs(got, expected) < 1e-6);
  }
}

TEST_CASE("One Euler step is the noise minus the training forward's velocity at t = 1", "[sample]") {
  // At t = 1 the flow-matching input is x_t = 1 * eps + 0 * a = eps exactly; one step with dt = -1 gives
  // eps - v(eps, 1) (spec §7.1, §7.2).
  Pi05 net = tiny_model(torch::kFloat64, 15);
  Pi05Batch b = sample_batch(5, torch::kFloat64);
  const torch::Tensor noise = sample_noise(2, 5, 32, 11).to(torch::kFloat64);
  b.noise = noise;
  b.time = torch::ones({2}, torch::kFloat64);
  const torch::Tensor v = net->forward(b).velocity.detach();
  SampleOptions o;
  o.num_steps = 1;
  CHECK(rel_err(Sampler(*net, o).sample(b, noise), noise - v) < 1e-12);
}

TEST_CASE("Sampling refuses noise of the wrong shape, naming the expected one", "[sample]") {
  Pi05 net = tiny_model(torch::kFloat32, 16);
  const Pi05Batch b = sample_batch(6, torch::kFloat32);
  Sampler sampler(*net);
  CHECK_THROWS_WITH(sampler.sample(b, torch::zeros({2, 5, 7})), Catch::Contains("noise must be [2, H, 32]"));
  CHECK_THROWS_WITH(sampler.sample(b, torch::zeros({1, 5, 32})), Catch::Contains("noise must be [2, H, 32]"));
  SampleOptions o;
  o.num_steps = 0;
  CHECK_THROWS_WITH(Sampler(*net, o), Catch::Contains("num_steps must be >= 1"));
}

TEST_CASE("GPU: the captured denoising loop replays what eager sampling computes", "[.gpu][sample]") {
  REQUIRE(torch::cuda::is_available());
  const torch::Device cuda(torch::kCUDA, 0);
  Pi05 net(Pi05Config::tiny(), cuda, torch::kBFloat16);
  init_weights(*net, 17);
  Pi05Batch b = sample_batch(7, torch::kFloat32);
  for (torch::Tensor* t : batch_tensors(b)) *t = t->to(cuda);
  const torch::Tensor noise = sample_noise(2, 5, 32, 12).to(cuda);
  SampleOptions eager_options;
  const torch::Tensor eager = Sampler(*net, eager_options).sample(b, noise);
  SampleOptions graph_options;
  graph_options.cuda_graph = true;
  Sampler graphed(*net, graph_options);
  const torch::Tensor first = graphed.sample(b, noise);  // eager, then captured
  INFO(graphed.graph_status());
  REQUIRE(graphed.graph_captures() == 1);
  const torch::Tensor replayed = graphed.sample(b, noise);
  CHECK(graphed.graph_replays() == 1);
  CHECK(torch::equal(first, eager));
  CHECK(torch::equal(replayed, eager));
  // Other noise through the same graph (static inputs rewritten, not baked in).
  const torch::Tensor noise2 = sample_noise(2, 5, 32, 13).to(cuda);
  CHECK(torch::equal(graphed.sample(b, noise2), Sampler(*net, eager_options).sample(b, noise2)));
}

TEST_CASE("GPU: bf16 fused sampling stays close to the fp32 reference sampler", "[.gpu][sample]") {
  REQUIRE(torch::cuda::is_available());
  const torch::Device cuda(torch::kCUDA, 0);
  Pi05 ref_net = tiny_model(torch::kFloat32, 18);
  Pi05 net(Pi05Config::tiny(), cuda, torch::kBFloat16);
  {
    torch::NoGradGuard no_grad;
    auto src = ref_net->named_parameters();
    for (auto& item : net->named_parameters()) item.value().copy_(src[item.key()]);
  }
  Pi05Batch b = sample_batch(8, torch::kFloat32);
  const torch::Tensor noise = sample_noise(2, 5, 32, 14);
  const torch::Tensor ref = Sampler(*ref_net).sample(b, noise);
  for (torch::Tensor* t : batch_tensors(b)) *t = t->to(cuda);
  const torch::Tensor got = Sampler(*net).sample(b, noise.to(cuda));
  CHECK(rel_err(got, ref) < 5e-2);
}

TEST_CASE("GPU: a single prompt is sampled without a mask, and the captured graphs take new inputs", "[.gpu][sample]") {
  REQUIRE(torch::cuda::is_available());
  const torch::Device cuda(torch::kCUDA, 0);
  Pi05 net(Pi05Config::tiny(), cuda, torch::kBFloat16);
  init_weights(*net, 19);
  auto one = [&](uint64_t seed) {
    Pi05Batch b = sample_batch(seed, torch::kFloat32, /*batch=*/1);
    // The same prompt length for both inputs, so both replay one graph.
    b.token_masks.fill_(false);
    b.token_masks.narrow(1, 0, 6).fill_(true);
    for (torch::Tensor* t : batch_tensors(b)) *t = t->to(cuda);
    return b;
  };
  const Pi05Batch first = one(21), second = one(22);
  const torch::Tensor noise = sample_noise(1, 5, 32, 15).to(cuda);
  SampleOptions graph_options;
  graph_options.cuda_graph = true;
  Sampler graphed(*net, graph_options);
  Sampler eager(*net);
  CHECK(torch::equal(graphed.sample(first, noise), eager.sample(first, noise)));  // eager, then captured
  INFO(graphed.graph_status());
  REQUIRE(graphed.graph_captures() == 1);
  SampleTiming timing;
  CHECK(torch::equal(graphed.sample(second, noise, &timing), eager.sample(second, noise)));
  CHECK(graphed.graph_replays() == 1);
  CHECK(graphed.graph_captures() == 1);
  CHECK(timing.vision_ms > 0);
  CHECK(timing.prefix_ms > 0);
  CHECK(timing.suffix_ms > 0);
  // And matches the fp32 reference path's math: the unmasked attention equals the masked one when nothing is padded.
  SampleOptions reference;
  reference.forward.kernels = Kernels::kReference;
  CHECK(rel_err(graphed.sample(first, noise), Sampler(*net, reference).sample(first, noise)) < 5e-2);
}
