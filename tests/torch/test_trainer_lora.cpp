// Recipe keys `freeze` and `lora` in the trainer (tiny config, CPU): the presets freeze LeRobot's module sets, bad
// selections are refused with the JSON path, frozen parameters get no gradient and no optimizer state and keep their
// bits, LoRA trains only the adapters (and what stays trainable), a resumed LoRA run equals a straight one, the final
// weights hold the merged model and the adapters alone, and `vlatune train --recipe` runs a LoRA recipe end to end.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <sys/stat.h>

#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cli_test_util.h"
#include "formats/json_error.h"
#include "formats/recipe.h"
#include "formats/run_record.h"
#include "layout/pi05.h"
#include "model/lora.h"
#include "model/safetensors_io.h"
#include "model/state_dict.h"
#include "temp_dir.h"
#include "tiny_train_options.h"
#include "trainer/recipe_apply.h"
#include "trainer/train_loop.h"
#include "trainer/train_step.h"
#include "tuner/cost_model.h"

namespace m = vlatune::model;
namespace t = vlatune::trainer;
namespace f = vlatune::formats;

namespace {

const std::string kVision = "paligemma_with_expert.paligemma.model.vision_tower";
const std::string kLm = "paligemma_with_expert.paligemma.model.language_model";
const std::string kExpert = "paligemma_with_expert.gemma_expert.model";

// Adapters on the expert's attention and the backbone's MLPs (tiny-config ranks), the vision tower frozen.
const char* kLoraRecipe = R"({"schema": "vlatune.recipe/1",
  "freeze": {"presets": ["freeze_vision_encoder"]},
  "lora": {"targets": [
    {"modules": ["paligemma_with_expert.gemma_expert.model.layers.*.self_attn.q_proj",
                 "paligemma_with_expert.gemma_expert.model.layers.*.self_attn.v_proj"], "rank": 4, "alpha": 8},
    {"modules": ["paligemma_with_expert.paligemma.model.language_model.layers.*.mlp.gate_proj",
                 "paligemma_with_expert.paligemma.model.language_model.layers.*.mlp.down_proj"], "rank": 2}]}})";

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

std::string fresh_dir(const std::string& tag) {
  return vlatune::test::make_temp_dir("lora") + "/" + tag;
}

t::TrainOptions tiny_options(const std::string& out, int64_t steps) {
  t::TrainOptions o = vlatune::test::tiny_train_options(out, steps);
  o.lr = 1e-2;  // large enough that a few steps move the adapters measurably
  o.warmup_steps = 1;
  o.decay_steps = 100;
  return o;
}

f::Recipe recipe_of(const std::string& text) {
  return f::parse_recipe(nlohmann::json::parse(text), "r.json");
}

// The tiny model with `recipe` applied; returns what was applied.
t::AppliedRecipe apply_text(m::Pi05& net, const std::string& recipe_text) {
  net = m::Pi05(m::Pi05Config::tiny(), torch::kCPU, torch::kFloat32);
  m::init_weights(*net, 1);
  return t::apply_recipe(recipe_of(recipe_text), "r.json", *net);
}

std::map<std::string, bool> requires_grad(const m::Pi05Impl& net) {
  std::map<std::string, bool> out;
  for (const auto& item : net.named_parameters()) out[item.key()] = item.value().requires_grad();
  return out;
}

bool within(const std::string& name, const std::string& module) {
  return name.compare(0, module.size() + 1, module + ".") == 0;
}

f::FormatError apply_error(const std::string& recipe_text) {
  m::Pi05 net{nullptr};
  try {
    apply_text(net, recipe_text);
  } catch (const f::FormatError& e) {
    return e;
  }
  FAIL("accepted: " << recipe_text);
  throw;
}

std::map<std::string, torch::Tensor> load_all(const std::string& path) {
  auto file = m::SafetensorsFile::open(path);
  std::map<std::string, torch::Tensor> out;
  for (const auto& e : file.entries()) out[e.name] = file.tensor(e.name);
  return out;
}

}  // namespace

TEST_CASE("The freezing presets freeze exactly LeRobot's module sets", "[train][freeze]") {
  m::Pi05 net{nullptr};
  auto applied = apply_text(net, R"({"freeze": {"presets": ["freeze_vision_encoder"]}})");
  CHECK(applied.frozen == std::vector<std::string>{kVision});
  for (const auto& [name, trains] : requires_grad(*net)) {
    INFO(name);
    CHECK(trains == !within(name, kVision));
  }
  const auto vision = requires_grad(*net);
  CHECK_FALSE(vision.at(kVision + ".vision_model.encoder.layers.1.mlp.fc1.weight"));
  CHECK_FALSE(vision.at(kVision + ".vision_model.embeddings.patch_embedding.weight"));
  CHECK(vision.at("paligemma_with_expert.paligemma.model.multi_modal_projector.linear.weight"));
  CHECK(vision.at(kLm + ".layers.0.self_attn.q_proj.weight"));

  applied = apply_text(net, R"({"freeze": {"presets": ["train_expert_only"]}})");
  CHECK(applied.frozen == std::vector<std::string>{"paligemma_with_expert.paligemma"});
  for (const auto& [name, trains] : requires_grad(*net)) {
    INFO(name);
    CHECK(trains == !within(name, "paligemma_with_expert.paligemma"));
  }
  const auto expert = requires_grad(*net);
  CHECK_FALSE(expert.at("paligemma_with_expert.paligemma.model.multi_modal_projector.linear.weight"));
  CHECK_FALSE(expert.at(kLm + ".embed_tokens.weight"));
  CHECK_FALSE(expert.at(kLm + ".layers.1.mlp.down_proj.weight"));
  CHECK_FALSE(expert.at(kLm + ".norm.weight"));
  CHECK(expert.at(kExpert + ".layers.0.input_layernorm.dense.weight"));
  CHECK(expert.at(kExpert + ".layers.1.mlp.up_proj.weight"));
  CHECK(expert.at("action_in_proj.weight"));
  CHECK(expert.at("time_mlp_out.bias"));

  // Patterns add to the presets (overlap is fine: freezing twice is freezing).
  applied = apply_text(net, R"({"freeze": {"presets": ["freeze_vision_encoder"],
      "modules": ["paligemma_with_expert.paligemma.model.vision_tower.vision_model.encoder.layers.*", "time_mlp_in"]}})");
  CHECK(applied.frozen.size() == 4);  // the tower, its 2 layers, time_mlp_in
  CHECK_FALSE(requires_grad(*net).at("time_mlp_in.weight"));
}

TEST_CASE("The openpi LoRA preset takes openpi's Linears and ranks; on the tiny config its rank 32 is refused",
          "[train][lora]") {
  // The tiny expert's k_proj/v_proj are [16, 32]: openpi's gemma_300m_lora rank 32 does not fit them.
  const f::FormatError e = apply_error(R"({"lora": {"preset": "openpi"}})");
  CHECK(e.json_path() == "$.lora.preset");
  CHECK_THAT(e.what(), Catch::Contains("rank 32") && Catch::Contains("k_proj [16, 32]"));
  // Its backbone part (rank 16 fits) and its freezing, as the preset lists them.
  const auto spec = vlatune::layout::lora_preset(f::LoraPreset::kOpenpi);
  REQUIRE(spec.targets.size() == 2);
  nlohmann::json recipe = nlohmann::json::object();
  recipe["freeze"]["modules"] = spec.frozen;
  recipe["lora"]["targets"] = nlohmann::json::array();
  recipe["lora"]["targets"].push_back(nlohmann::json{{"modules", spec.targets[0].modules}, {"rank", 16}});
  m::Pi05 net{nullptr};
  const auto applied = apply_text(net, recipe.dump());
  CHECK(applied.lora.size() == 2 * 7);  // 2 layers x q, k, v, o, gate, up, down
  CHECK(applied.lora.front().module == kLm + ".layers.0.self_attn.q_proj");
  const auto grads = requires_grad(*net);
  CHECK(grads.at(kLm + ".layers.0.self_attn.q_proj.lora_A"));
  CHECK(grads.at(kLm + ".layers.1.mlp.down_proj.lora_B"));
  CHECK_FALSE(grads.at(kLm + ".layers.0.self_attn.q_proj.weight"));
  CHECK_FALSE(grads.at(kLm + ".embed_tokens.weight"));
  CHECK_FALSE(grads.at(kExpert + ".layers.0.input_layernorm.dense.bias"));
  CHECK(grads.at(kVision + ".vision_model.encoder.layers.0.mlp.fc1.weight"));  // openpi trains the vision tower
  CHECK(grads.at("action_out_proj.weight"));
}

TEST_CASE("Bad freeze and LoRA selections are refused with the JSON path", "[train][lora]") {
  auto check = [](const std::string& text, const std::string& path, const std::string& part) {
    const f::FormatError e = apply_error(text);
    CHECK(e.json_path() == path);
    CHECK_THAT(e.what(), Catch::Contains(part) && Catch::Contains("r.json"));
  };
  check(R"({"freeze": {"modules": ["paligemma_with_expert.nothing"]}})", "$.freeze.modules[0]", "no module matches");
  check(R"({"lora": {"targets": [{"modules": ["action_out_proj"], "rank": 33}]}})", "$.lora.targets[0].rank",
        "rank 33 exceeds the smaller dimension of action_out_proj [32, 32]: at most 32");
  check(R"({"lora": {"targets": [{"modules": ["paligemma_with_expert.gemma_expert.model.layers.*.mlp"]}]}})",
        "$.lora.targets[0].modules", "is not a Linear");
  check(R"({"lora": {"targets": [{"modules": ["action_out_proj"], "rank": 2},
                                 {"modules": ["action_out_proj", "action_in_proj"], "rank": 4}]}})",
        "$.lora.targets[1].modules", "already has an adapter from $.lora.targets[0]");
  check(R"({"fp8": {"modules": ["paligemma_with_expert.gemma_expert.model.layers.0.self_attn.q_proj"]},
            "lora": {"targets": [{"modules": ["paligemma_with_expert.gemma_expert.model.layers.0.self_attn.k_proj"],
                                  "rank": 4}]}})",
        "$.lora.targets[0].modules", "runs in FP8 ($.fp8.modules)");
}

TEST_CASE("Frozen parameters get no gradient and no optimizer state and keep their bits; the rest trains",
          "[train][freeze][lora]") {
  std::ostringstream log;
  for (const char* text : {R"({"freeze": {"presets": ["train_expert_only"]}})", kLoraRecipe}) {
    INFO(text);
    t::TrainOptions o = tiny_options("", 1);
    t::TrainingParts parts = t::build_training_parts(o, recipe_of(text), "r.json", true, log);
    std::map<std::string, torch::Tensor> before;
    for (const auto& item : parts.net->named_parameters()) before[item.key()] = item.value().detach().clone();
    std::set<std::string> trainable;
    for (const auto& [name, p] : parts.named_params) trainable.insert(name);
    CHECK(trainable.size() < before.size());
    // The optimizer holds state for the trainable parameters alone.
    for (const auto& [name, tensor] : parts.optimizer->state_dict().tensors) {
      const std::string param = name.substr(name.find('.') + 1);
      INFO(name);
      CHECK(trainable.count(param) == 1);
    }
    CHECK(static_cast<size_t>(parts.optimizer->size()) == trainable.size());

    // One step by hand, to look at the gradients before the optimizer clears them.
    double wait_ms = 0;
    const auto batch = t::next_batch(parts, 0, 0, &wait_ms);
    t::forward_backward(parts, batch, parts.applied.forward, 1);
    for (const auto& item : parts.net->named_parameters()) {
      INFO(item.key());
      if (trainable.count(item.key()) == 0) CHECK_FALSE(item.value().grad().defined());
    }
    parts.net->zero_grad(/*set_to_none=*/true);
    const auto outcome = t::run_train_step(parts, 0, 1e-2, 1.0);
    CHECK(std::isfinite(outcome.loss));
    size_t changed = 0;
    for (const auto& item : parts.net->named_parameters()) {
      INFO(item.key());
      const bool same = torch::equal(item.value(), before.at(item.key()));
      if (trainable.count(item.key()) == 0) CHECK(same);
      changed += same ? 0 : 1;
    }
    CHECK(changed > trainable.size() / 2);
    for (const std::string& name :
         {std::string("action_out_proj.weight"), kExpert + ".layers.0.mlp.up_proj.weight",
          kExpert + ".layers.0.self_attn.q_proj.lora_B", kLm + ".layers.0.mlp.gate_proj.lora_B"}) {
      if (trainable.count(name) == 0) continue;
      INFO(name);
      CHECK_FALSE(torch::equal(parts.net->named_parameters()[name], before.at(name)));
    }
    // The memory model counts what the optimizer holds.
    std::vector<vlatune::tuner::ParameterShape> shapes;
    vlatune::tuner::TrainableSelection selection;
    selection.frozen = parts.applied.frozen;
    for (const auto& spec : parts.applied.lora) selection.lora.emplace_back(spec.module, spec.rank);
    for (const auto& item : parts.net->named_parameters())
      if (item.key().find(".lora_") == std::string::npos) shapes.push_back({item.key(), item.value().sizes().vec()});
    const auto bytes = vlatune::tuner::training_state_bytes(shapes, selection, 4, f::StateDtype::kAuto);
    CHECK(bytes.optimizer_bytes == static_cast<double>(parts.optimizer->state_bytes()));
    int64_t all = 0;
    for (const auto& item : parts.net->named_parameters()) all += item.value().numel();
    CHECK(bytes.parameter_bytes == 4.0 * static_cast<double>(all));
  }
}

TEST_CASE("A resumed LoRA run ends bit-identical to a straight one; final/ holds the merged model and the adapters",
          "[train][lora]") {
  std::ostringstream log;
  const std::string base = fresh_dir("resume");
  ::mkdir(base.c_str(), 0755);
  const std::string recipe = base + "/lora.json";
  write_text(recipe, kLoraRecipe);
  const std::string straight = base + "/straight", resumed = base + "/resumed";
  auto o = tiny_options(straight, 4);
  o.recipe_path = recipe;
  o.ema_decay = 0.9;
  t::run_training(o, log);
  o.out = resumed;
  o.steps = 2;
  t::run_training(o, log);
  t::TrainOptions again;
  again.resume = resumed;
  again.steps = 4;
  again.progress_bar = false;
  const auto r = t::run_training(again, log);
  CHECK(r.first_step == 2);
  CHECK(log.str().find("LoRA 8 Linear(s)") != std::string::npos);  // 2 layers x 2 + 2 layers x 2

  for (const char* file :
       {"final/model.safetensors", "final/adapters.safetensors", "checkpoints/step_00000004/model.safetensors",
        "checkpoints/step_00000004/optimizer.safetensors", "checkpoints/step_00000004/ema.safetensors"}) {
    INFO(file);
    auto a = load_all(straight + "/" + file), b = load_all(resumed + "/" + file);
    REQUIRE(a.size() == b.size());
    for (const auto& [name, tensor] : a) {
      INFO(name);
      REQUIRE(b.count(name) == 1);
      CHECK(torch::equal(tensor, b[name]));
    }
  }
  const auto ck = load_all(straight + "/checkpoints/step_00000004/optimizer.safetensors");
  CHECK(ck.count("exp_avg." + kExpert + ".layers.0.self_attn.q_proj.lora_B") == 1);
  CHECK(ck.count("exp_avg." + kExpert + ".layers.0.self_attn.q_proj.weight") == 0);
  CHECK(ck.count("exp_avg." + kVision + ".vision_model.post_layernorm.weight") == 0);

  // final/model.safetensors: the openpi names only, loadable as plain Pi0.5 weights. It is the merge of the last
  // checkpoint's weights under their EMA, and final/adapters.safetensors holds those adapters.
  m::Pi05 merged(m::Pi05Config::tiny(), torch::kCPU, torch::kFloat32);
  CHECK(m::load_state_dict(*merged, straight + "/final/model.safetensors", /*strict=*/true).ok());
  m::Pi05 adapted{nullptr};
  apply_text(adapted, kLoraRecipe);
  m::load_state_dict(*adapted, straight + "/checkpoints/step_00000004/model.safetensors", /*strict=*/true);
  {
    torch::NoGradGuard no_grad;
    const auto ema = load_all(straight + "/checkpoints/step_00000004/ema.safetensors");
    for (const auto& item : adapted->named_parameters())
      if (ema.count(item.key())) item.value().copy_(ema.at(item.key()));
  }
  const auto final_weights = load_all(straight + "/final/model.safetensors");
  const auto expected = m::merged_state_tensors(*adapted);
  REQUIRE(expected.size() == final_weights.size());
  for (const auto& [name, tensor] : expected) {
    INFO(name);
    CHECK(torch::equal(final_weights.at(name), tensor));
  }
  const auto adapters = load_all(straight + "/final/adapters.safetensors");
  CHECK(adapters.size() == 16);
  for (const auto& [name, tensor] : adapters) {
    INFO(name);
    CHECK(torch::equal(tensor, adapted->named_parameters()[name]));
  }
  const auto& q = *adapted->paligemma_with_expert->gemma_expert->model->layers[1]->self_attn->q_proj;
  CHECK_FALSE(torch::equal(final_weights.at(kExpert + ".layers.1.self_attn.q_proj.weight"), q.weight));
}

TEST_CASE("vlatune train --recipe trains a LoRA recipe end to end and records it", "[cli][train][lora]") {
  const std::string dir = vlatune::test::temp_dir("lora-cli");
  write_text(dir + "/lora.json", kLoraRecipe);
  const auto r = vlatune::test::run_cli(
      {"train",    "--config",         "tiny",  "--device",      "cpu",    "--batch",   "2",       "--workers",
       "1",        "--timing-warmup",  "0",     "--no-progress", "--data", "synthetic", "--steps", "2",
       "--recipe", dir + "/lora.json", "--out", dir + "/run"});
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out + r.err, Catch::Contains("trainable: ") && Catch::Contains("LoRA 8 Linear(s)"));
  const f::Recipe recorded = f::read_recipe(dir + "/run/recipe.json");
  CHECK(recorded.lora.targets.size() == 2);
  CHECK(recorded.freeze.presets.size() == 1);
  const auto run = f::read_run_record(dir + "/run/run.json");
  CHECK(run.environment.recipe_hash == f::recipe_hash(recorded));
  f::Recipe without_lora = recorded;
  without_lora.lora = {};
  CHECK(f::recipe_hash(without_lora) != run.environment.recipe_hash);
  CHECK(m::SafetensorsFile::open(dir + "/run/final/adapters.safetensors").entries().size() == 16);
}
