// The recompute unit `...language_model.layers.i.mlp.gate_proj+up_proj`: the backbone MLP's merged gate+up
// GEMM output is not kept from forward to backward but computed again by the same GEMM at the start of the MLP's
// backward. Loss and every gradient must be bit-identical to the unit not selected, on every path (reference,
// fused bf16 structure, FP8 in every gate+up/down precision mix); the unit nests in its MLP and its joint layer;
// recipes, the recomputable list and the profiler's A/B classes name it. On the GPU ([.gpu]): bit-identical there
// too, and the forward keeps exactly the merged outputs' bytes less.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "formats/json_error.h"
#include "formats/recipe.h"
#include "layout/pi05.h"
#include "model/pi05.h"
#include "model_step_test_util.h"
#include "profiler/scope.h"
#include "scope_sink_test_util.h"
#include "trainer/recipe_apply.h"
#include "trainer/train_step.h"

#ifdef VLATUNE_HAVE_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

using namespace vlatune::model;

namespace {

const std::string kLm = "paligemma_with_expert.paligemma.model.language_model.layers.";
const std::string kEx = "paligemma_with_expert.gemma_expert.model.layers.";

std::string gate_up(int i) {
  return kLm + std::to_string(i) + ".mlp.gate_proj+up_proj";
}

using Step = vlatune::test::ModelStep;
using vlatune::test::model_step;

// Bit for bit: torch::equal on the loss and on every gradient (NaN-free by construction).
void check_identical(const Step& got, const Step& ref) {
  CHECK(torch::equal(got.loss, ref.loss));
  REQUIRE(got.grads.size() == ref.grads.size());
  size_t differing = 0;
  for (const auto& [name, g] : ref.grads) {
    INFO(name);
    const bool same = torch::equal(got.grads.at(name), g);
    CHECK(same);
    differing += same ? 0 : 1;
  }
  CHECK(differing == 0);
}

// Run by run: as many steps, each bit for bit (`what` labels the step in a failure).
void check_identical(const std::vector<Step>& got, const std::vector<Step>& ref, const std::string& what = "step") {
  REQUIRE(got.size() == ref.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    INFO(what << " " << i);
    check_identical(got[i], ref[i]);
  }
}

// fp32 inputs (the model casts them to its compute dtype), drawn on the CPU and moved to `device`.
Pi05Batch tiny_batch(uint64_t seed, torch::Device device = torch::kCPU) {
  torch::Generator gen = at::detail::createCPUGenerator(seed);
  return make_random_batch(Pi05Config::tiny(), /*batch=*/3, /*slots=*/3, /*valid_slots=*/2, /*text_len=*/24,
                           /*min_prompt=*/3, /*max_prompt=*/20, /*horizon=*/5, &gen, device);
}

std::vector<std::string> decoder_fp8_fqns(const std::vector<std::string>& leaves) {
  std::vector<std::string> out;
  for (int i = 0; i < 2; ++i)
    for (const std::string& branch : {kLm, kEx})
      for (const std::string& leaf : leaves) out.push_back(branch + std::to_string(i) + "." + leaf);
  return out;
}

}  // namespace

TEST_CASE("The backbone MLPs' merged gate+up outputs are recomputable units, nested in their MLP and joint layer",
          "[model][recompute]") {
  Pi05Impl model(Pi05Config::tiny());
  const auto fqns = model.recomputable_fqns();
  CHECK(std::count(fqns.begin(), fqns.end(), gate_up(0)) == 1);
  CHECK(std::count(fqns.begin(), fqns.end(), gate_up(1)) == 1);  // the last layer's: listed as its MLP is
  CHECK(std::count(fqns.begin(), fqns.end(), kEx + "0.mlp.gate_proj+up_proj") == 0);  // backbone only
  // Listed right after its MLP.
  const auto mlp = std::find(fqns.begin(), fqns.end(), kLm + "0.mlp");
  REQUIRE(mlp != fqns.end());
  CHECK(*(mlp + 1) == gate_up(0));

  CHECK_NOTHROW(model.set_recompute({gate_up(0), gate_up(1)}));
  CHECK(model.recompute_selection() == std::vector<std::string>{gate_up(0), gate_up(1)});
  CHECK_THROWS_WITH(model.set_recompute({kLm + "0.mlp", gate_up(0)}),
                    Catch::Contains("'" + kLm + "0.mlp' contains '" + gate_up(0) + "'"));
  CHECK_THROWS_WITH(model.set_recompute({gate_up(1), kLm + "1"}),
                    Catch::Contains("'" + kLm + "1' contains '" + gate_up(1) + "'"));
  // The joint layer named by the expert branch is the same unit.
  CHECK_THROWS_WITH(model.set_recompute({kEx + "0", gate_up(0)}), Catch::Contains("nested"));
  // Other layers, the expert's MLP and the joint attention of the same layer do not contain it.
  CHECK_NOTHROW(model.set_recompute({kLm + "1.mlp", gate_up(0), kEx + "0.mlp", kLm + "0.self_attn"}));
  CHECK_THROWS_WITH(model.set_recompute({kLm + "0.mlp.gate_proj+down_proj"}), Catch::Contains("gate_proj+up_proj"));
  model.set_recompute({});
}

TEST_CASE("Recomputing the gate+up output gives bit-identical loss and gradients (CPU, fused and reference paths)",
          "[model][recompute]") {
  const auto dtype = GENERATE(torch::kFloat32, torch::kBFloat16);
  const auto kernels = GENERATE(Kernels::kFused, Kernels::kReference);
  const bool skip_dead = GENERATE(true, false);
  INFO("dtype " << c10::toString(dtype) << ", fused " << (kernels == Kernels::kFused) << ", skip_dead " << skip_dead);
  Pi05 net(Pi05Config::tiny(), torch::kCPU, dtype);
  init_weights(*net, 21);
  const auto batch = tiny_batch(3);
  ForwardOptions o;
  o.kernels = kernels;
  o.skip_dead = skip_dead;
  net->set_recompute({});
  const Step ref = model_step(*net, batch, o);
  for (const auto& selection : std::vector<std::vector<std::string>>{
           {gate_up(0)}, {gate_up(0), gate_up(1)}, {gate_up(0), kEx + "0.mlp", kLm + "1.self_attn", kLm + "1.mlp"}}) {
    INFO("selection: " << selection.size() << " units, first " << selection.front());
    net->set_recompute(selection);
    check_identical(model_step(*net, batch, o), ref);
  }
  net->set_recompute({});
}

TEST_CASE("The gate+up rebuild runs once per backward, in the MLP's scope and the recompute phase",
          "[model][recompute]") {
  using vlatune::profiler::Phase;
  const auto kernels = GENERATE(Kernels::kFused, Kernels::kReference);
  INFO("fused " << (kernels == Kernels::kFused));
  Pi05 net(Pi05Config::tiny(), torch::kCPU, torch::kFloat32);
  init_weights(*net, 25);
  const auto batch = tiny_batch(7);
  ForwardOptions o;
  o.kernels = kernels;
  o.skip_dead = false;
  net->set_recompute({gate_up(0)});  // layer 1's prefix MLP feeds nothing: no backward
  vlatune::test::RecordingScopeSink sink;
  vlatune::profiler::set_scope_sink(&sink);
  auto out = net->forward(batch, o);
  out.loss.backward();
  vlatune::profiler::set_scope_sink(nullptr);
  net->set_recompute({});
  const std::string mlp0 = kLm + "0.mlp", mlp1 = kLm + "1.mlp";
  if (kernels == Kernels::kFused) {
    CHECK(sink.count(mlp0, Phase::kRecompute) == 1);  // the merged GEMM again, nothing else of the MLP
    CHECK(sink.count(mlp0 + ".down_proj", Phase::kRecompute) == 0);
  } else {
    CHECK(sink.count(mlp0 + ".gate_proj", Phase::kRecompute) == 1);
    CHECK(sink.count(mlp0 + ".up_proj", Phase::kRecompute) == 1);
    CHECK(sink.count(mlp0 + ".down_proj", Phase::kRecompute) == 0);
  }
  CHECK(sink.count(mlp0, Phase::kForward) == 1);
  CHECK(sink.count(mlp1, Phase::kRecompute) == 0);
  CHECK(sink.count(mlp1 + ".gate_proj", Phase::kRecompute) == 0);
}

TEST_CASE("Recomputing the gate+up output under FP8 gives bit-identical loss and gradients (CPU emulation)",
          "[model][recompute][fp8]") {
  // Every precision mix of the two autograd nodes: FP8 gate+up and down, FP8 gate+up only (bf16 GeGLU+down node
  // rebuilding from the FP8 node's x_q^T), FP8 down only (FP8 GeGLU+down node rebuilding a bf16 merged GEMM).
  const auto leaves = GENERATE(std::vector<std::string>{"self_attn.q_proj", "mlp.gate_proj", "mlp.down_proj"},
                               std::vector<std::string>{"mlp.up_proj"}, std::vector<std::string>{"mlp.down_proj"});
  const auto scaling = GENERATE(Fp8Scaling::kCurrent, Fp8Scaling::kDelayed);
  INFO("FP8 leaves " << leaves.size() << " first " << leaves.front() << ", delayed "
                     << (scaling == Fp8Scaling::kDelayed));
  Pi05 net(Pi05Config::tiny(), torch::kCPU, torch::kFloat32);
  init_weights(*net, 23);
  const auto batch = tiny_batch(4);
  ForwardOptions o;
  o.kernels = Kernels::kFused;
  o.skip_dead = false;  // both layers' prefix MLPs run
  Fp8Config config;
  config.scaling = scaling;
  // Fresh FP8 state (amax histories) for each run, then three steps so that delayed scaling uses its history.
  auto run = [&](const std::vector<std::string>& recompute) {
    net->set_recompute(recompute);
    net->set_fp8(decoder_fp8_fqns(leaves), config);
    std::vector<Step> steps;
    for (int i = 0; i < 3; ++i) steps.push_back(model_step(*net, batch, o));
    return steps;
  };
  const auto ref = run({});
  const auto got = run({gate_up(0), gate_up(1)});
  check_identical(got, ref);
  net->set_fp8({});
  net->set_recompute({});
}

namespace {

// The gate+up GEMM's FP8 states of the backbone layers (the merged GEMM keeps gate_proj's).
int64_t pending_grads_taken(Pi05Impl& net) {
  int64_t n = 0;
  for (const auto& item : net.named_modules()) {
    const auto* l = dynamic_cast<const LinearImpl*>(item.value().get());
    if (l != nullptr && l->fp8 && item.key().find("mlp.gate_proj") != std::string::npos)
      n += l->fp8->pending_grads_taken;
  }
  return n;
}

// Loss and gradients of `steps` FP8 steps with the fused GeGLU casts on and off, with and without the gate+up unit.
void check_fused_geglu_casts(Pi05Impl& net, const Pi05Batch& batch, const ForwardOptions& o, Fp8Scaling scaling,
                             int steps) {
  const auto leaves = std::vector<std::string>{"self_attn.q_proj", "mlp.gate_proj", "mlp.down_proj"};
  for (const bool recompute : {false, true}) {
    INFO("gate+up recomputed " << recompute << ", delayed " << (scaling == Fp8Scaling::kDelayed));
    auto run = [&](bool fused) {
      Fp8Config config;
      config.scaling = scaling;
      config.fused_geglu_casts = fused;
      net.set_recompute(recompute ? std::vector<std::string>{gate_up(0)} : std::vector<std::string>{});
      net.set_fp8(decoder_fp8_fqns(leaves), config);
      std::vector<Step> out;
      for (int i = 0; i < steps; ++i) out.push_back(model_step(net, batch, o));
      return out;
    };
    const auto ref = run(false);
    CHECK(pending_grads_taken(net) == 0);
    const auto got = run(true);
    CHECK(pending_grads_taken(net) == steps);  // layer 0's MLP (layer 1's is dead work with skip_dead)
    check_identical(got, ref);
  }
  net.set_fp8({});
  net.set_recompute({});
}

}  // namespace

TEST_CASE("The fused FP8 GeGLU casts give the unfused casts' loss and gradients bit for bit (CPU emulation)",
          "[model][fp8]") {
  // On the CPU the fused casts run their reference (GeGLU, then the plain cast), so this checks the plumbing: the
  // GeGLU backward hands the gate+up GEMM its FP8 gradient, scaled by that GEMM's own amax history.
  const auto scaling = GENERATE(Fp8Scaling::kCurrent, Fp8Scaling::kDelayed);
  Pi05 net(Pi05Config::tiny(), torch::kCPU, torch::kFloat32);
  init_weights(*net, 41);
  ForwardOptions o;
  o.kernels = Kernels::kFused;
  o.trim_text = false;  // 3 x 32 backbone rows: a multiple of 16, as the fused casts need
  check_fused_geglu_casts(*net, tiny_batch(6), o, scaling, 3);
}

TEST_CASE("GeGLU inputs kept in e4m3 blocks leave the FP8 forward unchanged and its gradients close (CPU emulation)",
          "[model][fp8]") {
  const bool fused = GENERATE(false, true);
  INFO("fused GeGLU casts " << fused);
  Pi05 net(Pi05Config::tiny(), torch::kCPU, torch::kFloat32);
  init_weights(*net, 43);
  ForwardOptions o;
  o.kernels = Kernels::kFused;
  o.trim_text = false;  // 3 x 32 backbone rows: a multiple of 16, as the blocks need
  const Pi05Batch batch = tiny_batch(7);
  auto run = [&](bool blocks) {
    Fp8Config config;
    config.fused_geglu_casts = fused;
    config.saved_geglu_blocks = blocks;
    net->set_fp8(decoder_fp8_fqns({"self_attn.q_proj", "mlp.gate_proj", "mlp.down_proj"}), config);
    return model_step(*net, batch, o);
  };
  const Step ref = run(false);
  const Step got = run(true);
  net->set_fp8({});
  CHECK(torch::equal(got.loss, ref.loss));  // the forward reads merged itself either way
  REQUIRE(got.grads.size() == ref.grads.size());
  int64_t differing = 0;
  for (const auto& [name, g] : ref.grads) {
    INFO(name);
    const torch::Tensor a = g.flatten().to(torch::kFloat64), b = got.grads.at(name).flatten().to(torch::kFloat64);
    if (!torch::equal(a, b)) ++differing;
    // A key bias's exact gradient is zero (softmax ignores a constant per query): both hold rounding noise.
    if (name.find("self_attn.k_proj.bias") != std::string::npos) continue;
    if (a.norm().item<double>() > 0) CHECK(torch::cosine_similarity(a, b, 0).item<double>() > 0.99);
  }
  // Layer 0's GeGLU gradient reads the rounded values: its gate+up weights and everything before them move.
  CHECK(differing > 0);
  CHECK_FALSE(torch::equal(got.grads.at(kLm + "0.mlp.gate_proj.weight"), ref.grads.at(kLm + "0.mlp.gate_proj.weight")));
  // down_proj's weight gradient reads its input rebuilt from the rounded values.
  CHECK_FALSE(torch::equal(got.grads.at(kLm + "0.mlp.down_proj.weight"), ref.grads.at(kLm + "0.mlp.down_proj.weight")));
}

TEST_CASE("fp8.saved_geglu_inputs reaches every FP8 Linear's config and needs an FP8 down projection",
          "[recipe][fp8]") {
  Pi05Impl model(Pi05Config::tiny());
  vlatune::formats::Recipe recipe;
  recipe.fp8.saved_geglu_inputs = vlatune::formats::SavedGegluInputs::kE4m3Blocks;
  recipe.fp8.modules = {kLm + "*.mlp.*"};
  vlatune::trainer::apply_recipe(recipe, "r.json", model);
  int64_t fp8_linears = 0, with_blocks = 0;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    const auto* l = dynamic_cast<const LinearImpl*>(item.value().get());
    if (l == nullptr || !l->fp8) continue;
    ++fp8_linears;
    with_blocks += l->fp8->config.saved_geglu_blocks ? 1 : 0;
    CHECK(l->fp8->config.gemm_algorithm == vlatune::kernels::Fp8GemmAlgorithm::kHeuristic);
  }
  CHECK(fp8_linears == 6);  // gate, up and down of both backbone layers
  CHECK(with_blocks == fp8_linears);
  recipe.fp8.modules = {kLm + "*.self_attn.q_proj"};
  try {
    vlatune::trainer::apply_recipe(recipe, "r.json", model);
    FAIL("expected a FormatError");
  } catch (const vlatune::formats::FormatError& e) {
    CHECK(e.json_path() == "$.fp8.saved_geglu_inputs");
    CHECK_THAT(e.what(), Catch::Contains("down projection"));
  }
}

TEST_CASE("A recipe selects the gate+up units by pattern and refuses them nested in their MLP", "[recompute][recipe]") {
  Pi05Impl model(Pi05Config::tiny());
  vlatune::formats::Recipe recipe;
  recipe.recompute.modules = {kLm + "*.mlp.gate_proj+up_proj", kEx + "0.mlp"};
  const auto applied = vlatune::trainer::apply_recipe(recipe, "r.json", model);
  CHECK(applied.recompute == std::vector<std::string>{kEx + "0.mlp", gate_up(0), gate_up(1)});
  CHECK(model.recompute_selection() == applied.recompute);

  recipe.recompute.modules = {kLm + "0.mlp", kLm + "0.mlp.gate_proj+up_proj"};
  try {
    vlatune::trainer::apply_recipe(recipe, "r.json", model);
    FAIL("nested selection accepted");
  } catch (const vlatune::formats::FormatError& e) {
    CHECK_THAT(e.what(), Catch::Contains("r.json") && Catch::Contains("$.recompute.modules[1]") &&
                             Catch::Contains("nests") && Catch::Contains(gate_up(0)));
  }
  // The joint layer named by the expert: refused by the model, still naming the recipe's path.
  recipe.recompute.modules = {kEx + "1", kLm + "1.mlp.gate_proj+up_proj"};
  CHECK_THROWS_WITH(vlatune::trainer::apply_recipe(recipe, "r.json", model),
                    Catch::Contains("$.recompute.modules") && Catch::Contains("nested"));
  // `*` matches the unit's segment like any other: `mlp.*` also names the MLP's Linears, which are not recomputable.
  recipe.recompute.modules = {kLm + "0.mlp.*"};
  CHECK_THROWS_WITH(vlatune::trainer::apply_recipe(recipe, "r.json", model),
                    Catch::Contains("no recomputable module '" + kLm + "0.mlp.gate_proj'"));
  model.set_recompute({});
}

TEST_CASE(
    "The shipped FP8 recipe applies to the full model as planned: nothing recomputed, the backbone and SigLIP's "
    "q/k/v, out_proj, fc1 and fc2 in FP8",
    "[recompute][recipe][fp8]") {
  Pi05Impl model(Pi05Config::full(), torch::Device(torch::kMeta));
  const std::string path = std::string(VLATUNE_SOURCE_DIR) + "/recipes/pi05_libero_h200_fp8.json";
  const auto applied = vlatune::trainer::apply_recipe(vlatune::formats::read_recipe(path), path, model);
  const std::string vit = "paligemma_with_expert.paligemma.model.vision_tower.vision_model.encoder.layers.";
  CHECK(applied.recompute.empty());
  // q/k/v, o, gate, up and down of the 18 backbone layers (a merged GEMM's FP8 covers all its members), and q, k, v,
  // out_proj, fc1 and fc2 of the 27 SigLIP layers; the expert's Linears stay bf16.
  CHECK(applied.fp8.size() == 18 * 7 + 27 * 6);
  CHECK(std::all_of(applied.fp8.begin(), applied.fp8.end(), [&](const std::string& f) {
    const bool vision_linear =
        f.rfind(vit, 0) == 0 &&
        (f.find(".self_attn.q_proj") != std::string::npos || f.find(".self_attn.k_proj") != std::string::npos ||
         f.find(".self_attn.v_proj") != std::string::npos || f.find(".self_attn.out_proj") != std::string::npos ||
         f.find(".mlp.fc1") != std::string::npos || f.find(".mlp.fc2") != std::string::npos);
    return f.rfind(kLm, 0) == 0 || vision_linear;
  }));
  CHECK(applied.fp8_delayed);
  CHECK(applied.effective.fp8.saved_geglu_inputs == vlatune::formats::SavedGegluInputs::kE4m3Blocks);
  CHECK(applied.effective.fp8.gemm_algorithm == vlatune::formats::Fp8GemmAlgorithm::kTimed);
  CHECK(applied.effective.data.trim_text);
  // fp8.gemm_algorithm reaches every FP8 Linear's config.
  int64_t timed = 0;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    const auto* l = dynamic_cast<const LinearImpl*>(item.value().get());
    if (l != nullptr && l->fp8) timed += l->fp8->config.gemm_algorithm == vlatune::kernels::Fp8GemmAlgorithm::kTimed;
  }
  CHECK(timed > 0);
}

TEST_CASE("On a GPU without FP8 the shipped FP8 recipe trains in bf16, e4m3-block inputs included", "[recipe][fp8]") {
  const std::string path = std::string(VLATUNE_SOURCE_DIR) + "/recipes/pi05_libero_h200_fp8.json";
  vlatune::formats::Recipe recipe = vlatune::formats::read_recipe(path);
  std::ostringstream log;
  vlatune::trainer::drop_fp8_for_capability(recipe, 90, log);  // an H100: kept
  CHECK_FALSE(recipe.fp8.modules.empty());
  CHECK(log.str().empty());
  vlatune::trainer::drop_fp8_for_capability(recipe, 80, log);  // an A100
  CHECK(recipe.fp8.modules.empty());
  CHECK(recipe.fp8.saved_geglu_inputs == vlatune::formats::SavedGegluInputs::kBf16);
  CHECK(recipe.fp8.gemm_algorithm == vlatune::formats::Fp8GemmAlgorithm::kHeuristic);
  CHECK_THAT(log.str(), Catch::Contains("compute capability 8.0") && Catch::Contains("train in bf16"));
  // What is left applies: the recompute set (empty in this plan), no FP8 Linear.
  Pi05Impl model(Pi05Config::full(), torch::Device(torch::kMeta));
  const auto applied = vlatune::trainer::apply_recipe(recipe, path, model);
  CHECK(applied.fp8.empty());
  CHECK(applied.recompute ==
        std::vector<std::string>(recipe.recompute.modules.begin(), recipe.recompute.modules.end()));
}

TEST_CASE("The profiler's A/B classes include the backbone MLPs' gate+up outputs", "[recompute][profiler]") {
  Pi05Impl model(Pi05Config::tiny());
  std::map<std::string, std::vector<std::string>> classes;
  for (const auto& [name, fqns] : vlatune::layout::recompute_classes(model.recomputable_fqns())) classes[name] = fqns;
  REQUIRE(classes.count("backbone_mlp_gate_up") == 1);
  CHECK(classes.at("backbone_mlp_gate_up") == std::vector<std::string>{gate_up(0), gate_up(1)});
  CHECK(classes.at("backbone_mlp") == std::vector<std::string>{kLm + "0.mlp", kLm + "1.mlp"});
}

#ifdef VLATUNE_HAVE_CUDA
namespace {
// Deterministic kernels (embedding backward) and the materialized attention, so that two runs of the same graph
// agree bit for bit on the GPU; restored on exit.
struct DeterministicGuard {
  bool before = at::globalContext().deterministicAlgorithms();
  bool warn_before = at::globalContext().deterministicAlgorithmsWarnOnly();
  DeterministicGuard() { at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/true); }
  ~DeterministicGuard() { at::globalContext().setDeterministicAlgorithms(before, warn_before); }
};
}  // namespace
#endif

TEST_CASE("On the GPU, recomputing the gate+up output gives bit-identical gradients, bf16 and FP8",
          "[.gpu][model][recompute][fp8]") {
#ifdef VLATUNE_HAVE_CUDA
  REQUIRE(torch::cuda::is_available());
  DeterministicGuard deterministic;
  const torch::Device dev(torch::kCUDA, 0);
  const bool fp8 = GENERATE(false, true);
  INFO("fp8 " << fp8);
  Pi05 net(Pi05Config::tiny(), dev, torch::kBFloat16);
  init_weights(*net, 31);
  const auto batch = tiny_batch(5, dev);
  ForwardOptions o;  // kAuto: the fused kernels on CUDA
  o.attention = Attention::kMaterialized;
  Fp8Config config;
  config.scaling = Fp8Scaling::kDelayed;
  auto run = [&](const std::vector<std::string>& recompute) {
    net->set_recompute(recompute);
    net->set_fp8(
        fp8 ? decoder_fp8_fqns({"self_attn.q_proj", "mlp.gate_proj", "mlp.down_proj"}) : std::vector<std::string>{},
        config);
    std::vector<Step> steps;
    for (int i = 0; i < 2; ++i) steps.push_back(model_step(*net, batch, o));
    return steps;
  };
  const auto ref = run({});
  const auto again = run({});
  check_identical(again, ref, "reproducibility of the baseline itself, step");
  const auto got = run({gate_up(0), gate_up(1)});
  check_identical(got, ref);
  net->set_fp8({});
  net->set_recompute({});
#else
  FAIL("built without CUDA");
#endif
}

TEST_CASE("On the GPU, the fused FP8 GeGLU casts give the unfused casts' loss and gradients bit for bit",
          "[.gpu][model][fp8]") {
#ifdef VLATUNE_HAVE_CUDA
  REQUIRE(torch::cuda::is_available());
  DeterministicGuard deterministic;
  const torch::Device dev(torch::kCUDA, 0);
  const auto scaling = GENERATE(Fp8Scaling::kCurrent, Fp8Scaling::kDelayed);
  Pi05 net(Pi05Config::tiny(), dev, torch::kBFloat16);
  init_weights(*net, 43);
  ForwardOptions o;  // kAuto: the fused kernels on CUDA
  o.attention = Attention::kMaterialized;
  o.trim_text = false;  // 3 x 32 backbone rows: a multiple of 16, as the fused casts need
  check_fused_geglu_casts(*net, tiny_batch(8, dev), o, scaling, 2);
#else
  FAIL("built without CUDA");
#endif
}

TEST_CASE("On the GPU, the gate+up unit keeps exactly the merged outputs' bytes less from forward to backward",
          "[.gpu][model][recompute][fp8]") {
#ifdef VLATUNE_HAVE_CUDA
  REQUIRE(torch::cuda::is_available());
  const torch::Device dev(torch::kCUDA, 0);
  const bool fp8 = GENERATE(false, true);
  INFO("fp8 " << fp8);
  // A wider backbone MLP than tiny's (2 x 2048 columns) so that the merged output is a sizeable allocation.
  Pi05Config cfg = Pi05Config::tiny();
  cfg.backbone.width = 256;
  cfg.backbone.mlp = 2048;
  Pi05 net(cfg, dev, torch::kBFloat16);
  init_weights(*net, 33);
  torch::Generator gen = at::detail::createCPUGenerator(6);
  const auto batch = make_random_batch(cfg, 3, 3, 2, 24, 3, 20, 5, &gen, dev);
  ForwardOptions o;
  o.skip_dead = false;          // both layers' prefix MLPs run
  o.keep_prefix_states = true;  // the prefix length P (same references in every run)
  const auto allocated = [&] {
    torch::cuda::synchronize();
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(dev.index());
    return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].current;
  };
  int64_t rows = 0;
  auto held_after_forward = [&](const std::vector<std::string>& recompute) {
    net->set_recompute(recompute);
    net->set_fp8(fp8 ? decoder_fp8_fqns({"mlp.gate_proj", "mlp.down_proj"}) : std::vector<std::string>{});
    net->zero_grad(/*set_to_none=*/true);
    const int64_t before = allocated();
    auto out = net->forward(batch, o);
    const int64_t held = allocated() - before;
    rows = out.prefix_states.at(0).size(0) * out.prefix_states.at(0).size(1);
    out.loss.backward();
    return held;
  };
  const int64_t without = held_after_forward({});
  const int64_t with_one = held_after_forward({gate_up(0)});
  const int64_t with_two = held_after_forward({gate_up(0), gate_up(1)});
  // One merged output per selected layer: [rows, 2 x mlp] bf16; the FP8 GEMM writes rows padded to 16 (the
  // output is a view of that allocation). 2 x 2048 x 2 bytes per row: whole 512-byte allocator blocks.
  const int64_t allocated_rows = fp8 ? (rows + 15) / 16 * 16 : rows;
  const int64_t merged_bytes = allocated_rows * 2 * cfg.backbone.mlp * 2;
  INFO("held after forward: " << without << " / " << with_one << " / " << with_two << " bytes; rows " << rows);
  CHECK(without - with_one == merged_bytes);
  CHECK(without - with_two == 2 * merged_bytes);
  net->set_fp8({});
  net->set_recompute({});
#else
  FAIL("built without CUDA");
#endif
}
