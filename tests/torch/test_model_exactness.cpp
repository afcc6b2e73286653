// The exact shortcuts (slot pruning, text trimming, dead last-layer work) and recompute leave the loss and every
// gradient unchanged: float64 on the CPU, tiny config, same batch.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <map>
#include <mutex>

#include "model/pi05.h"
#include "model_step_test_util.h"
#include "profiler/scope.h"
#include "scope_sink_test_util.h"

using namespace vlatune::model;

namespace {

using Result = vlatune::test::ModelStep;

// A key bias only adds q.b to every logit of a query row, and softmax ignores a per-row constant: its exact
// gradient is zero, so both runs hold rounding noise (~1e-17 in fp64) that no relative bound can compare.
bool is_zero_by_symmetry(const std::string& name) {
  const std::string suffix = "self_attn.k_proj.bias";
  return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Max abs difference relative to the largest magnitude of the reference tensor.
void check_same(const Result& got, const Result& ref, double tol) {
  auto rel = [](const torch::Tensor& a, const torch::Tensor& b) {
    const double scale = std::max(b.abs().max().item<double>(), 1e-30);
    return (a - b).abs().max().item<double>() / scale;
  };
  CHECK(rel(got.loss, ref.loss) <= tol);
  CHECK(rel(got.velocity, ref.velocity) <= tol);
  REQUIRE(got.grads.size() == ref.grads.size());
  double largest = 0.0;
  for (const auto& item : ref.grads) largest = std::max(largest, item.second.abs().max().item<double>());
  for (const auto& [name, g] : ref.grads) {
    INFO(name);
    const auto& other = got.grads.at(name);
    if (is_zero_by_symmetry(name)) {
      CHECK(other.abs().max().item<double>() <= 1e-12 * largest);
    } else if (g.abs().max().item<double>() == 0.0) {
      CHECK(other.abs().max().item<double>() == 0.0);
    } else {
      CHECK(rel(other, g) <= tol);
    }
  }
}

ForwardOptions unshortened() {
  ForwardOptions o;
  o.prune_slots = false;
  o.trim_text = false;
  o.skip_dead = false;
  return o;
}

// 3 camera slots, the third masked for the whole batch; prompts 3..9 of 40 text positions.
Pi05Batch exactness_batch(uint64_t seed) {
  torch::Generator gen = at::globalContext().defaultGenerator(torch::kCPU).clone();
  gen.set_current_seed(seed);
  auto b = make_random_batch(Pi05Config::tiny(), /*batch=*/3, /*slots=*/3, /*valid_slots=*/2, /*text_len=*/40,
                             /*min_prompt=*/3, /*max_prompt=*/9, /*horizon=*/5, &gen, torch::kCPU);
  b.image_masks[2][1] = false;  // a slot masked for one sample only stays (and is masked per sample)
  return batch_to(b, torch::kFloat64);
}

Pi05Impl& tiny_fp64_model() {
  static Pi05 model = [] {
    Pi05 m(Pi05Config::tiny(), torch::kCPU, torch::kFloat64);
    init_weights(*m, 1234);
    return m;
  }();
  model->set_recompute({});
  return *model;
}

constexpr double kExactTol = 1e-11;

}  // namespace

TEST_CASE("Pruning camera slots masked for the whole batch is exact", "[model]") {
  auto& model = tiny_fp64_model();
  auto b = exactness_batch(1);
  auto ref = vlatune::test::model_step(model, b, unshortened());
  auto options = unshortened();
  options.prune_slots = true;
  check_same(vlatune::test::model_step(model, b, options), ref, kExactTol);
}

TEST_CASE("Trimming the text to the longest prompt, rounded up, is exact", "[model]") {
  auto& model = tiny_fp64_model();
  auto b = exactness_batch(2);
  auto ref = vlatune::test::model_step(model, b, unshortened());
  for (int64_t multiple : {16, 1, 64}) {
    INFO("trim_multiple " << multiple);
    auto options = unshortened();
    options.trim_text = true;
    options.trim_multiple = multiple;
    check_same(vlatune::test::model_step(model, b, options), ref, kExactTol);
  }
}

TEST_CASE("apply_input_shortcuts cuts what the forward cuts, and a forward of its output cuts nothing more",
          "[model]") {
  auto b = exactness_batch(3);
  const int64_t longest = b.token_masks.sum(1).max().item<int64_t>();  // right padding: last true index + 1
  auto options = unshortened();
  options.prune_slots = true;
  options.trim_text = true;
  options.trim_multiple = 4;
  const Pi05Batch cut = apply_input_shortcuts(b, options);
  CHECK(cut.images.size(1) == 2);  // the third slot is masked for the whole batch
  CHECK(cut.image_masks.size(1) == 2);
  CHECK(torch::equal(cut.image_masks, b.image_masks.narrow(1, 0, 2)));
  CHECK(cut.tokens.size(1) == (longest + 3) / 4 * 4);
  CHECK(torch::equal(cut.tokens, b.tokens.narrow(1, 0, cut.tokens.size(1))));
  CHECK(cut.actions.is_same(b.actions));  // the rest is shared, not copied
  CHECK(cut.noise.is_same(b.noise));
  // What StepGraph does: the shortcuts applied first, the forward told to skip them, the same step.
  auto& model = tiny_fp64_model();
  auto ref = vlatune::test::model_step(model, b, options);
  auto none = options;
  none.prune_slots = false;
  none.trim_text = false;
  check_same(vlatune::test::model_step(model, cut, none), ref, 0.0);
  // Both off: the batch itself.
  const Pi05Batch same = apply_input_shortcuts(b, none);
  CHECK(same.images.is_same(b.images));
  CHECK(same.tokens.is_same(b.tokens));
}

TEST_CASE("A batch's host summary of its masks gives the shortcuts the masks give; one that does not fit is refused",
          "[model]") {
  auto options = unshortened();
  options.prune_slots = true;
  options.trim_text = true;
  options.trim_multiple = 4;
  auto b = exactness_batch(4);
  b.image_masks.select(1, 0).fill_(false);  // slot 0 empty, slots 1 (partly) and 2 used: an index, not a prefix
  b.image_masks.select(1, 2).fill_(true);
  const Pi05Batch read = apply_input_shortcuts(b, options);
  Pi05Batch summarized = b;
  const torch::Tensor any = b.image_masks.any(0);
  summarized.used_slots.emplace();
  for (int64_t s = 0; s < any.size(0); ++s) summarized.used_slots->push_back(any[s].item<bool>());
  summarized.text_used = b.token_masks.sum(1).max().item<int64_t>();  // right padding: last true index + 1
  const Pi05Batch cut = apply_input_shortcuts(summarized, options);
  REQUIRE(read.images.size(1) == 2);
  CHECK(torch::equal(cut.images, read.images));
  CHECK(torch::equal(cut.image_masks, read.image_masks));
  CHECK(torch::equal(cut.tokens, read.tokens));
  CHECK(torch::equal(cut.token_masks, read.token_masks));
  CHECK(cut.used_slots == std::vector<bool>{true, true});  // the summary follows the cut
  CHECK(read.text_used == cut.text_used);
  // A prefix of used slots is cut as a view.
  Pi05Batch prefix = exactness_batch(5);
  prefix.used_slots = std::vector<bool>{true, true, false};
  const Pi05Batch two = apply_input_shortcuts(prefix, options);
  CHECK(two.images.size(1) == 2);
  CHECK(two.images.data_ptr() == prefix.images.data_ptr());
  // Summaries that do not fit the tensors.
  Pi05Batch bad = summarized;
  bad.used_slots = std::vector<bool>{true, true};
  CHECK_THROWS_WITH(apply_input_shortcuts(bad, options), Catch::Contains("used_slots names 2 slots"));
  bad = summarized;
  bad.text_used = b.tokens.size(1) + 1;
  CHECK_THROWS_WITH(apply_input_shortcuts(bad, options), Catch::Contains("text_used 41 is outside [0, 40]"));
}

TEST_CASE("Skipping the last layer's dead prefix work is exact after filling missing grads", "[model]") {
  auto& model = tiny_fp64_model();
  auto b = exactness_batch(3);
  auto ref = vlatune::test::model_step(model, b, unshortened());
  auto options = unshortened();
  options.skip_dead = true;
  auto got = vlatune::test::model_step(model, b, options);
  check_same(got, ref, kExactTol);
  // The dead parameters really are dead: zero gradient in both runs.
  for (const std::string name :
       {"paligemma_with_expert.paligemma.model.language_model.layers.1.self_attn.q_proj.weight",
        "paligemma_with_expert.paligemma.model.language_model.layers.1.mlp.up_proj.weight",
        "paligemma_with_expert.paligemma.model.language_model.norm.weight"}) {
    INFO(name);
    CHECK(ref.grads.at(name).abs().max().item<double>() == 0.0);
  }
  // ...while the last layer's prefix K/V feed the suffix.
  CHECK(got.grads.at("paligemma_with_expert.paligemma.model.language_model.layers.1.self_attn.k_proj.weight")
            .abs()
            .max()
            .item<double>() > 0.0);
}

TEST_CASE("All shortcuts together, with either attention path, are exact", "[model]") {
  auto& model = tiny_fp64_model();
  auto b = exactness_batch(4);
  for (auto mode : {Attention::kLean, Attention::kMaterialized}) {
    auto base = unshortened();
    base.attention = mode;
    auto ref = vlatune::test::model_step(model, b, base);
    ForwardOptions all;
    all.attention = mode;
    check_same(vlatune::test::model_step(model, b, all), ref, kExactTol);
  }
}

TEST_CASE("Recomputing any recomputable module gives identical loss and gradients", "[model]") {
  auto& model = tiny_fp64_model();
  auto b = exactness_batch(5);
  const std::string lm = "paligemma_with_expert.paligemma.model.language_model.layers.";
  const std::string ex = "paligemma_with_expert.gemma_expert.model.layers.";
  const std::string vt = "paligemma_with_expert.paligemma.model.vision_tower";
  const std::vector<std::vector<std::string>> selections = {
      {vt},
      {vt + ".vision_model.encoder.layers.0", vt + ".vision_model.encoder.layers.1"},
      {lm + "0", ex + "1"},
      {lm + "0.self_attn", ex + "1.self_attn"},
      {lm + "0.mlp", lm + "1.mlp", ex + "0.mlp", ex + "1.mlp"},
      {lm + "0", lm + "1.self_attn", ex + "1.mlp", vt},
  };
  for (bool skip_dead : {true, false}) {
    ForwardOptions options;
    options.skip_dead = skip_dead;
    model.set_recompute({});
    auto ref = vlatune::test::model_step(model, b, options);
    for (const auto& selection : selections) {
      INFO("skip_dead " << skip_dead << ", first of selection: " << selection.front());
      model.set_recompute(selection);
      check_same(vlatune::test::model_step(model, b, options), ref, 1e-12);
    }
  }
  model.set_recompute({});
}

TEST_CASE("set_recompute rejects an unknown FQN and a nested selection, naming them", "[model]") {
  Pi05Impl model(Pi05Config::tiny());
  const std::string lm = "paligemma_with_expert.paligemma.model.language_model.layers.";
  CHECK_THROWS_AS(model.set_recompute({lm + "7"}), std::invalid_argument);
  CHECK_THROWS_WITH(model.set_recompute({lm + "7"}), Catch::Contains("'" + lm + "7'"));
  CHECK_THROWS_WITH(model.set_recompute({lm + "0.mlp.gate_proj"}), Catch::Contains(lm + "0.mlp.gate_proj"));
  CHECK_THROWS_WITH(model.set_recompute({lm + "1.mlp", lm + "1"}),
                    Catch::Contains("'" + lm + "1' contains '" + lm + "1.mlp'"));
  CHECK_THROWS_WITH(
      model.set_recompute({"paligemma_with_expert.gemma_expert.model.layers.0", lm + "0.self_attn"}),
      Catch::Contains("paligemma_with_expert.gemma_expert.model.layers.0") && Catch::Contains(lm + "0.self_attn"));
  const std::string vt = "paligemma_with_expert.paligemma.model.vision_tower";
  CHECK_THROWS_WITH(model.set_recompute({vt + ".vision_model.encoder.layers.1", vt}), Catch::Contains("nested"));
  // Both names of one joint layer select the same unit: not nested.
  CHECK_NOTHROW(model.set_recompute({lm + "1", "paligemma_with_expert.gemma_expert.model.layers.1"}));
  CHECK_NOTHROW(model.set_recompute({lm + "0.mlp", "paligemma_with_expert.gemma_expert.model.layers.0.mlp"}));
}

TEST_CASE("Module scopes name the FQNs, and a recomputed module's re-run records the recompute phase", "[model]") {
  using vlatune::profiler::Phase;
  auto& model = tiny_fp64_model();
  auto b = exactness_batch(6);
  const std::string mlp = "paligemma_with_expert.gemma_expert.model.layers.0.mlp";
  model.set_recompute({mlp});
  vlatune::test::RecordingScopeSink sink;
  vlatune::profiler::set_scope_sink(&sink);
  auto out = model.forward(b, ForwardOptions{});
  out.loss.backward();
  vlatune::profiler::set_scope_sink(nullptr);
  model.set_recompute({});
  auto count = [&](const std::string& fqn, Phase phase) {
    return std::count_if(sink.pushes.begin(), sink.pushes.end(),
                         [&](const auto& p) { return p.first == fqn && p.second == phase; });
  };
  CHECK(count(mlp, Phase::kForward) == 1);
  CHECK(count(mlp, Phase::kRecompute) == 1);
  CHECK(count(mlp + ".down_proj", Phase::kRecompute) == 1);
  CHECK(count("paligemma_with_expert.paligemma.model.language_model.layers.1.mlp", Phase::kRecompute) == 0);
  CHECK(count("paligemma_with_expert.paligemma.model.vision_tower.vision_model.encoder.layers.1.self_attn.q_proj",
              Phase::kForward) == 1);
  CHECK(count("action_out_proj", Phase::kForward) == 1);
  CHECK(count("time_mlp_in", Phase::kForward) == 1);
}
