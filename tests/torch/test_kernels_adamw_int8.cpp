// 8-bit AdamW state (kernels/adamw_int8*, trainer/optimizer with optimizer.state_dtype "int8-blockwise"): the code
// maps, the reference's quantization against a brute-force nearest search, closeness to full-precision AdamW, the
// state round trip and its refusal across dtypes, the tiny model's loss curve against full-precision AdamW (CPU);
// the fused CUDA kernel against the reference, bit for bit ([.gpu]).
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "formats/recipe.h"
#include "formats/run_record.h"
#include "kernels/adamw_int8_math.h"
#include "kernels/adamw_ops.h"
#include "model/batch.h"
#include "model/pi05.h"
#include "model/safetensors_io.h"
#include "reports/stats.h"
#include "tiny_train_options.h"
#include "trainer/optimizer.h"
#include "trainer/train_loop.h"

namespace {

using Named = std::vector<std::pair<std::string, torch::Tensor>>;
using vlatune::kernels::adamw_quant_blocks;
using vlatune::kernels::adamw_quant_maps;
using vlatune::kernels::AdamwInt8State;
using vlatune::kernels::AdamwParams;
using vlatune::trainer::AdamW;
using vlatune::trainer::AdamWOptions;
using vlatune::trainer::OptimizerPrecision;
using vlatune::trainer::OptimizerStateDtype;

double rel_err(const torch::Tensor& out, const torch::Tensor& ref) {
  const double den = ref.to(torch::kFloat64).norm().item<double>();
  const double num = (out.to(torch::kFloat64) - ref.to(torch::kFloat64)).norm().item<double>();
  return den == 0 ? num : num / den;
}

torch::Tensor map_tensor(const float* map) {
  return torch::from_blob(const_cast<float*>(map), {256}, torch::kFloat32).clone();
}

// Values of an 8-bit moment: code_map[code] * absmax of its block.
torch::Tensor dequantize(const torch::Tensor& codes, const torch::Tensor& absmax, const float* map) {
  const int64_t n = codes.numel();
  torch::Tensor values = map_tensor(map).index({codes.reshape({-1}).to(torch::kLong)});
  torch::Tensor scale = absmax.repeat_interleave(vlatune::kernels::kAdamwQuantBlock).slice(0, 0, n);
  return (values * scale).reshape(codes.sizes());
}

// A fresh 8-bit state for `params` (as the trainer's AdamW makes it).
AdamwInt8State fresh_state(const std::vector<torch::Tensor>& params) {
  AdamwInt8State s;
  for (const torch::Tensor& p : params) {
    const auto opts = p.options();
    s.exp_avg.push_back(torch::full_like(p, adamw_quant_maps().exp_avg_zero, opts.dtype(torch::kUInt8)));
    s.exp_avg_sq.push_back(torch::full_like(p, adamw_quant_maps().exp_avg_sq_zero, opts.dtype(torch::kUInt8)));
    s.exp_avg_absmax.push_back(torch::zeros({adamw_quant_blocks(p.numel())}, opts.dtype(torch::kFloat32)));
    s.exp_avg_sq_absmax.push_back(torch::zeros({adamw_quant_blocks(p.numel())}, opts.dtype(torch::kFloat32)));
  }
  return s;
}

AdamwInt8State clone_state(const AdamwInt8State& s, torch::Device device) {
  auto copy = [&](const std::vector<torch::Tensor>& v) {
    std::vector<torch::Tensor> out;
    for (const torch::Tensor& t : v) out.push_back(t.to(device).clone());
    return out;
  };
  return {copy(s.exp_avg), copy(s.exp_avg_sq), copy(s.exp_avg_absmax), copy(s.exp_avg_sq_absmax)};
}

// Shapes: a block multiple, a size with a partial last block, a vector shorter than one block, and two chunks of
// the kernel (65536 elements) plus a tail.
const std::vector<std::vector<int64_t>> kShapes = {{64, 32}, {300, 7}, {100}, {70001}};

std::vector<torch::Tensor> random_tensors(torch::Dtype dtype, double scale, uint64_t seed) {
  torch::manual_seed(seed);
  std::vector<torch::Tensor> out;
  for (const auto& shape : kShapes) out.push_back((torch::randn(shape) * scale).to(dtype));
  return out;
}

AdamwParams hyper(int64_t step) {
  AdamwParams hp;
  hp.lr = 1e-3;
  hp.weight_decay = 0.01;
  hp.step = step;
  return hp;
}

}  // namespace

TEST_CASE("The 8-bit code maps are sorted, hold 0 and 1, span seven decades, and quantize to themselves",
          "[optimizer][int8]") {
  const auto& maps = adamw_quant_maps();
  for (const float* map : {maps.exp_avg, maps.exp_avg_sq}) {
    for (int k = 1; k < 256; ++k) CHECK(map[k - 1] < map[k]);
    CHECK(map[255] == 1.0f);
  }
  CHECK(maps.exp_avg[maps.exp_avg_zero] == 0.0f);
  CHECK(maps.exp_avg_sq[maps.exp_avg_sq_zero] == 0.0f);
  CHECK(maps.exp_avg_sq_zero == 0);  // unsigned: nothing below 0
  CHECK(maps.exp_avg[0] == Approx(-0.99297).epsilon(1e-4));
  // The smallest non-zero magnitudes: the first decade (1e-7 .. 1e-6).
  CHECK(maps.exp_avg[maps.exp_avg_zero + 1] == Approx(0.55e-6).epsilon(1e-5));
  CHECK(maps.exp_avg_sq[1] == Approx(0.325e-6).epsilon(1e-5));

  float mid[256];
  for (int k = 0; k < 256; ++k) mid[k] = vlatune::kernels::int8_math::code_midpoint(maps.exp_avg, k);
  for (int k = 0; k < 256; ++k) CHECK(vlatune::kernels::int8_math::quantize_index(mid, maps.exp_avg[k]) == k);
  CHECK(vlatune::kernels::int8_math::quantize_index(mid, 2.0f) == 255);
  CHECK(vlatune::kernels::int8_math::quantize_index(mid, -2.0f) == 0);
}

TEST_CASE("The 8-bit reference stores each moment as the code point nearest to it over its block's absmax",
          "[optimizer][int8]") {
  const auto& maps = adamw_quant_maps();
  std::vector<torch::Tensor> p = random_tensors(torch::kFloat32, 1.0, 1);
  const std::vector<torch::Tensor> g = random_tensors(torch::kFloat32, 0.01, 2);
  AdamwInt8State state = fresh_state(p);
  vlatune::kernels::adamw_step_int8(p, g, state, nullptr, hyper(1));

  // After the first step from zero, m = (1 - beta1) g and v = (1 - beta2) g^2 exactly as fp32 computes them.
  for (size_t i = 0; i < p.size(); ++i) {
    const torch::Tensor m = g[i].mul(0.1f).reshape({-1}), v = g[i].mul(0.05f).mul(g[i]).reshape({-1});
    for (const auto& [values, codes, absmax, map] :
         {std::make_tuple(m, state.exp_avg[i], state.exp_avg_absmax[i], maps.exp_avg),
          std::make_tuple(v, state.exp_avg_sq[i], state.exp_avg_sq_absmax[i], maps.exp_avg_sq)}) {
      const int64_t n = values.numel(), blocks = adamw_quant_blocks(n);
      torch::Tensor padded = torch::cat({values.abs(), torch::zeros({blocks * 256 - n})}).reshape({blocks, 256});
      CHECK(torch::equal(absmax, std::get<0>(padded.max(1))));
      // Brute force: no code point is nearer to value / absmax than the stored one (up to the rounding of the
      // distances themselves, where a value sits on a midpoint).
      torch::Tensor scaled = values * absmax.reciprocal().repeat_interleave(256).slice(0, 0, n);
      torch::Tensor distances = (scaled.unsqueeze(1) - map_tensor(map).unsqueeze(0)).abs();
      torch::Tensor stored = distances.gather(1, codes.reshape({-1, 1}).to(torch::kLong)).squeeze(1);
      CHECK((stored - std::get<0>(distances.min(1))).max().item<float>() <= 1e-6f);
    }
  }
}

TEST_CASE("8-bit AdamW stays close to full-precision AdamW over 50 steps", "[optimizer][int8]") {
  std::vector<torch::Tensor> p8 = random_tensors(torch::kFloat32, 1.0, 3);
  std::vector<torch::Tensor> p32;
  for (const auto& t : p8) p32.push_back(t.clone());
  AdamwInt8State state = fresh_state(p8);
  std::vector<torch::Tensor> m, v;
  for (const auto& t : p32) m.push_back(torch::zeros_like(t)), v.push_back(torch::zeros_like(t));
  std::vector<torch::Tensor> start;
  for (const auto& t : p32) start.push_back(t.clone());
  for (int step = 1; step <= 50; ++step) {
    // A persistent direction plus noise, as gradients of a real loss have.
    const std::vector<torch::Tensor> noise = random_tensors(torch::kFloat32, 0.02, 100 + step);
    std::vector<torch::Tensor> g;
    for (size_t i = 0; i < p32.size(); ++i) g.push_back(noise[i] + 0.01 * start[i]);
    vlatune::kernels::adamw_step_int8(p8, g, state, nullptr, hyper(step));
    vlatune::kernels::adamw_step(p32, g, m, v, nullptr, hyper(step));
  }
  for (size_t i = 0; i < p32.size(); ++i) {
    INFO("tensor " << i);
    // Compare the distance travelled: the parameters themselves barely move at lr 1e-3.
    CHECK(rel_err(p8[i] - start[i], p32[i] - start[i]) < 0.02);
    CHECK(rel_err(dequantize(state.exp_avg[i], state.exp_avg_absmax[i], adamw_quant_maps().exp_avg), m[i]) < 0.05);
    CHECK(rel_err(dequantize(state.exp_avg_sq[i], state.exp_avg_sq_absmax[i], adamw_quant_maps().exp_avg_sq), v[i]) <
          0.02);
  }
}

TEST_CASE("A non-finite grad scale leaves the 8-bit state and the parameters unchanged", "[optimizer][int8]") {
  std::vector<torch::Tensor> p = random_tensors(torch::kFloat32, 1.0, 4);
  const std::vector<torch::Tensor> g = random_tensors(torch::kFloat32, 0.01, 5);
  AdamwInt8State state = fresh_state(p);
  vlatune::kernels::adamw_step_int8(p, g, state, nullptr, hyper(1));
  const std::vector<torch::Tensor> p_before = {p[0].clone(), p[3].clone()};
  const torch::Tensor codes_before = state.exp_avg[3].clone(), absmax_before = state.exp_avg_sq_absmax[3].clone();
  vlatune::kernels::adamw_step_int8(p, g, state, nullptr, hyper(2), torch::full({}, NAN));
  CHECK(torch::equal(p[0], p_before[0]));
  CHECK(torch::equal(p[3], p_before[1]));
  CHECK(torch::equal(state.exp_avg[3], codes_before));
  CHECK(torch::equal(state.exp_avg_sq_absmax[3], absmax_before));
}

TEST_CASE("adamw_step_int8 rejects state of the wrong dtype or block count, naming the tensor", "[optimizer][int8]") {
  std::vector<torch::Tensor> p = {torch::zeros({300})};
  const std::vector<torch::Tensor> g = {torch::ones({300})};
  AdamwInt8State state = fresh_state(p);
  state.exp_avg_sq_absmax[0] = torch::zeros({1});
  CHECK_THROWS_WITH(vlatune::kernels::adamw_step_int8(p, g, state, nullptr, hyper(1)),
                    Catch::Contains("exp_avg_sq_absmax[0]") && Catch::Contains("[2]"));
  state = fresh_state(p);
  state.exp_avg[0] = torch::zeros({300});
  CHECK_THROWS_WITH(vlatune::kernels::adamw_step_int8(p, g, state, nullptr, hyper(1)),
                    Catch::Contains("exp_avg[0] must be a contiguous u8"));
}

TEST_CASE("int8-blockwise quantizes the large tensors only and shrinks the optimizer state", "[optimizer][int8]") {
  torch::manual_seed(6);
  Named named = {{"big.weight", torch::randn({128, 64}).requires_grad_(true)},
                 {"small.bias", torch::randn({64}).requires_grad_(true)}};
  AdamWOptions full_options, int8_options;
  int8_options.state_dtype = OptimizerStateDtype::kInt8Blockwise;
  AdamW full(named, full_options), int8(named, int8_options);
  const auto state = int8.state_dict();
  std::map<std::string, torch::Dtype> dtypes;
  for (const auto& [name, t] : state.tensors) dtypes[name] = t.scalar_type();
  CHECK(dtypes.at("exp_avg.big.weight") == torch::kUInt8);
  CHECK(dtypes.at("exp_avg_absmax.big.weight") == torch::kFloat32);
  CHECK(dtypes.at("exp_avg.small.bias") == torch::kFloat32);  // below kInt8StateMinNumel
  CHECK(dtypes.count("exp_avg_absmax.small.bias") == 0);
  // fp32 state: 8 B per element; 8-bit: 2 B plus 8 B per 256-element block.
  CHECK(full.state_bytes() == 8 * (128 * 64 + 64));
  CHECK(int8.state_bytes() == 2 * 128 * 64 + 8 * 32 + 8 * 64);
}

TEST_CASE("The 8-bit optimizer state round-trips through state_dict and continues bit-exactly", "[optimizer][int8]") {
  auto make = [](uint64_t seed) {
    torch::manual_seed(seed);
    return Named{{"a.weight", torch::randn({96, 64}).requires_grad_(true)},
                 {"b.weight", torch::randn({5000}).requires_grad_(true)}};
  };
  AdamWOptions options;
  options.state_dtype = OptimizerStateDtype::kInt8Blockwise;
  Named straight = make(7), resumed = make(7);
  AdamW a(straight, options);
  auto step_with = [](Named& named, AdamW& opt, int step) {
    torch::manual_seed(1000 + step);
    for (auto& [name, p] : named) p.mutable_grad() = torch::randn_like(p) * 0.1;
    opt.step(1e-3, 1.0);
  };
  for (int s = 0; s < 3; ++s) step_with(straight, a, s);
  // Save (cloned, as a checkpoint file would hold them), then continue both ways.
  vlatune::trainer::OptimizerState saved = a.state_dict();
  for (auto& entry : saved.tensors) entry.second = entry.second.clone();
  for (size_t i = 0; i < straight.size(); ++i) resumed[i].second.data().copy_(straight[i].second.data());
  AdamW b(resumed, options);
  b.load_state_dict(saved);
  CHECK(b.step_count() == 3);
  for (int s = 3; s < 6; ++s) {
    step_with(straight, a, s);
    step_with(resumed, b, s);
  }
  for (size_t i = 0; i < straight.size(); ++i) CHECK(torch::equal(straight[i].second, resumed[i].second));
  const auto sa = a.state_dict(), sb = b.state_dict();
  for (size_t i = 0; i < sa.tensors.size(); ++i) CHECK(torch::equal(sa.tensors[i].second, sb.tensors[i].second));

  // A full-precision run refuses the 8-bit state, naming both dtypes, and the other way round.
  AdamW full(make(7));
  CHECK_THROWS_WITH(full.load_state_dict(saved),
                    Catch::Contains("state dtype is \"int8-blockwise\", this run's is \"auto\""));
  CHECK_THROWS_WITH(b.load_state_dict(full.state_dict()),
                    Catch::Contains("state dtype is \"auto\", this run's is \"int8-blockwise\""));
}

TEST_CASE("8-bit AdamW's loss curve on the tiny model tracks full-precision AdamW", "[optimizer][int8]") {
  // The CPU form of the numerics gate `vlatune check` applies to long runs (Pearson >= 0.999, mean relative
  // difference <= 1%): same initial weights, same batches (a fresh one per step, as training draws them), only the
  // moments' storage differs. Every tensor is quantized (the tiny model's tensors are mostly below
  // kInt8StateMinNumel). The learning rate is high for the tiny model, so that the loss moves within 50 steps.
  constexpr int kSteps = 50;
  const auto cfg = vlatune::model::Pi05Config::tiny();
  vlatune::model::Pi05 init(cfg);
  vlatune::model::init_weights(*init, 11);
  torch::Generator gen = at::detail::createCPUGenerator(12);
  std::vector<vlatune::model::Pi05Batch> batches;
  for (int i = 0; i < kSteps; ++i)
    batches.push_back(vlatune::model::make_random_batch(cfg, 2, 2, 2, 16, 4, 16, 5, &gen, torch::kCPU));
  // One action chunk for every sample: a target the tiny model learns within a few dozen steps (random actions
  // leave it nothing to learn but the mean).
  const torch::Tensor chunk = torch::rand({1, 5, cfg.action_dim}, gen) * 2 - 1;
  for (auto& b : batches) b.actions = chunk.expand_as(b.actions).contiguous();

  auto curve = [&](OptimizerStateDtype state_dtype, int64_t* state_bytes) {
    vlatune::model::Pi05 net(cfg);
    {
      torch::NoGradGuard no_grad;
      auto src = init->named_parameters();
      for (auto& item : net->named_parameters()) item.value().copy_(src[item.key()]);
    }
    Named named;
    for (auto& item : net->named_parameters()) named.emplace_back(item.key(), item.value());
    AdamWOptions options;
    options.state_dtype = state_dtype;
    options.int8_min_numel = 0;
    AdamW opt(named, options);
    *state_bytes = opt.state_bytes();
    std::vector<double> losses;
    for (int step = 0; step < kSteps; ++step) {
      const auto& batch = batches[step % batches.size()];
      opt.zero_grad();
      auto out = net->forward(batch);
      out.loss.backward();
      losses.push_back(out.loss.item<double>());
      opt.step(3e-3, 1.0);
    }
    return losses;
  };
  int64_t full_bytes = 0, int8_bytes = 0;
  const std::vector<double> full = curve(OptimizerStateDtype::kAuto, &full_bytes);
  const std::vector<double> int8 = curve(OptimizerStateDtype::kInt8Blockwise, &int8_bytes);
  CHECK(int8_bytes < full_bytes / 3);  // fp32 moments here: 8 B per parameter against ~2.06
  auto mean = [](const std::vector<double>& v, size_t from, size_t to) {
    double s = 0;
    for (size_t i = from; i < to; ++i) s += v[i];
    return s / static_cast<double>(to - from);
  };
  REQUIRE(mean(full, kSteps - 10, kSteps) < 0.7 * mean(full, 0, 10));  // the curve has a trend to track
  CHECK(full != int8);                                                 // and the 8-bit state did change the run
  const double r = vlatune::reports::pearson(full, int8);
  const double mean_rel = vlatune::reports::series_error(full, int8).mean_relative;
  INFO("Pearson " << r << ", mean relative difference " << mean_rel);
  CHECK(r >= 0.999);
  CHECK(mean_rel <= 0.01);
}

TEST_CASE("A tiny run with 8-bit AdamW state resumes bit-identical to a straight run and records the key",
          "[optimizer][int8][train]") {
  char templ[] = "/tmp/vlatune-int8-XXXXXX";
  REQUIRE(::mkdtemp(templ) != nullptr);
  const std::string dir = templ, recipe = dir + "/recipe.json";
  std::ofstream(recipe) << R"({"schema": "vlatune.recipe/1", "optimizer": {"state_dtype": "int8-blockwise"}})";
  auto options = [&](const std::string& out, int64_t steps) {
    auto o = vlatune::test::tiny_train_options(out, steps);
    o.recipe_path = recipe;
    return o;
  };
  std::ostringstream log;
  vlatune::trainer::run_training(options(dir + "/straight", 4), log);
  vlatune::trainer::run_training(options(dir + "/resumed", 2), log);
  vlatune::trainer::TrainOptions again;
  again.resume = dir + "/resumed";
  again.steps = 4;
  again.progress_bar = false;
  CHECK(vlatune::trainer::run_training(again, log).first_step == 2);
  INFO(log.str());
  CHECK(log.str().find("optimizer state: int8-blockwise") != std::string::npos);

  auto load_all = [](const std::string& path) {
    auto f = vlatune::model::SafetensorsFile::open(path);
    std::map<std::string, torch::Tensor> out;
    for (const auto& e : f.entries()) out[e.name] = f.tensor(e.name);
    return out;
  };
  int quantized = 0;
  for (const char* file : {"final/model.safetensors", "checkpoints/step_00000004/optimizer.safetensors"}) {
    INFO(file);
    auto a = load_all(dir + "/straight/" + file), b = load_all(dir + "/resumed/" + file);
    REQUIRE(a.size() == b.size());
    for (const auto& [name, t] : a) {
      INFO(name);
      REQUIRE(b.count(name) == 1);
      CHECK(torch::equal(t, b[name]));
      if (name.rfind("exp_avg.", 0) == 0 && t.scalar_type() == torch::kUInt8) ++quantized;
    }
  }
  CHECK(quantized > 0);  // the tiny model's tensors of >= kInt8StateMinNumel elements hold 8-bit moments
  // The recipe the run recorded (--batch written in) keeps the key, and run.json's recipe hash is that recipe's.
  const auto run = vlatune::formats::read_run_record(dir + "/straight/run.json");
  const auto recorded = vlatune::formats::read_recipe(dir + "/straight/recipe.json");
  CHECK(recorded.optimizer.state_dtype == vlatune::formats::StateDtype::kInt8Blockwise);
  CHECK(run.environment.recipe_hash == vlatune::formats::recipe_hash(recorded));
  vlatune::formats::Recipe without = recorded;
  without.optimizer.state_dtype = vlatune::formats::StateDtype::kAuto;
  CHECK(run.environment.recipe_hash != vlatune::formats::recipe_hash(without));
}

TEST_CASE("The fused CUDA 8-bit AdamW equals the CPU reference bit for bit for every storage",
          "[.gpu][optimizer][int8]") {
  REQUIRE(torch::cuda::is_available());
  using vlatune::kernels::AdamwStorage;
  const auto storage = GENERATE(AdamwStorage::kFp32, AdamwStorage::kBf16, AdamwStorage::kFp32Master);
  INFO("storage " << vlatune::kernels::adamw_storage_name(storage));
  const bool master_mode = storage == AdamwStorage::kFp32Master;
  const auto p_dtype = storage == AdamwStorage::kFp32 ? torch::kFloat32 : torch::kBFloat16;
  const torch::Device cuda(torch::kCUDA);

  // Four shapes as above, plus 200 small tensors so that one list needs more than one launch (192 tensors).
  std::vector<torch::Tensor> p = random_tensors(p_dtype, 1.0, 20);
  torch::manual_seed(21);
  for (int i = 0; i < 200; ++i) p.push_back(torch::randn({257 + i}).to(p_dtype));
  std::vector<torch::Tensor> master;
  if (master_mode)
    for (const auto& t : p) master.push_back(t.to(torch::kFloat32));
  AdamwInt8State state = fresh_state(p);

  auto to = [](const std::vector<torch::Tensor>& v, torch::Device d) {
    std::vector<torch::Tensor> out;
    for (const auto& t : v) out.push_back(t.defined() ? t.to(d).clone() : torch::Tensor());
    return out;
  };
  std::vector<torch::Tensor> gp = to(p, cuda), gmaster = to(master, cuda);
  AdamwInt8State gstate = clone_state(state, cuda);
  for (int step = 1; step <= 3; ++step) {
    torch::manual_seed(30 + step);
    std::vector<torch::Tensor> g;
    for (const auto& t : p) g.push_back((torch::randn(t.sizes()) * 0.01).to(p_dtype));
    if (step == 2) g[1] = torch::Tensor();  // a missing gradient: zero
    const torch::Tensor scale = torch::full({}, 0.75f);
    vlatune::kernels::adamw_step_int8(p, g, state, master_mode ? &master : nullptr, hyper(step), scale);
    const std::vector<torch::Tensor> gg = to(g, cuda);
    vlatune::kernels::adamw_step_int8(gp, gg, gstate, master_mode ? &gmaster : nullptr, hyper(step), scale.to(cuda));
  }
  for (size_t i = 0; i < p.size(); ++i) {
    INFO("tensor " << i);
    REQUIRE(torch::equal(gp[i].cpu(), p[i]));
    REQUIRE(torch::equal(gstate.exp_avg[i].cpu(), state.exp_avg[i]));
    REQUIRE(torch::equal(gstate.exp_avg_sq[i].cpu(), state.exp_avg_sq[i]));
    REQUIRE(torch::equal(gstate.exp_avg_absmax[i].cpu(), state.exp_avg_absmax[i]));
    REQUIRE(torch::equal(gstate.exp_avg_sq_absmax[i].cpu(), state.exp_avg_sq_absmax[i]));
    if (master_mode) REQUIRE(torch::equal(gmaster[i].cpu(), master[i]));
  }
}

TEST_CASE("The fused CUDA 8-bit AdamW writes nothing when the device grad scale is not finite",
          "[.gpu][optimizer][int8]") {
  REQUIRE(torch::cuda::is_available());
  const torch::Device cuda(torch::kCUDA);
  std::vector<torch::Tensor> p = {torch::randn({70001}, torch::TensorOptions().device(cuda))};
  const std::vector<torch::Tensor> g = {torch::randn({70001}, torch::TensorOptions().device(cuda))};
  AdamwInt8State state = fresh_state(p);
  vlatune::kernels::adamw_step_int8(p, g, state, nullptr, hyper(1));
  const torch::Tensor before = p[0].clone(), codes = state.exp_avg[0].clone();
  vlatune::kernels::adamw_step_int8(p, g, state, nullptr, hyper(2), torch::full({}, INFINITY, cuda));
  CHECK(torch::equal(p[0], before));
  CHECK(torch::equal(state.exp_avg[0], codes));
}
