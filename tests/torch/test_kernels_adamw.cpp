// kernels/adamw_* and trainer/optimizer, trainer/ema: the ATen reference against torch::optim::AdamW, clipping,
// the non-finite guard, fp32 master weights, bit-exact state round trip, EMA math (CPU); the fused CUDA kernels
// against the ATen reference ([.gpu]).
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "kernels/adamw_ops.h"
#include "trainer/ema.h"
#include "trainer/optimizer.h"

namespace {

using Named = std::vector<std::pair<std::string, torch::Tensor>>;
using vlatune::trainer::AdamW;
using vlatune::trainer::AdamWOptions;
using vlatune::trainer::OptimizerPrecision;

double rel_err(const torch::Tensor& out, const torch::Tensor& ref) {
  const double den = ref.to(torch::kFloat64).norm().item<double>();
  const double num = (out.to(torch::kFloat64) - ref.to(torch::kFloat64)).norm().item<double>();
  return den == 0 ? num : num / den;
}

// Shapes of a small model: matrices, a bias, an odd vector, a scalar-like tensor.
const std::vector<std::vector<int64_t>> kShapes = {{16, 8}, {8}, {5, 3, 7}, {33}, {1}};

Named make_params(torch::Dtype dtype, uint64_t seed) {
  torch::manual_seed(seed);
  Named named;
  for (size_t i = 0; i < kShapes.size(); ++i) {
    const std::string name = "layers." + std::to_string(i) + (kShapes[i].size() == 1 ? ".bias" : ".weight");
    named.emplace_back(name, torch::randn(kShapes[i]).to(dtype).requires_grad_(true));
  }
  return named;
}

// grads[step][param]: fixed random gradients so that two runs see the same ones.
std::vector<std::vector<torch::Tensor>> make_grads(int steps, torch::Dtype dtype, uint64_t seed, double scale = 1) {
  torch::manual_seed(seed);
  std::vector<std::vector<torch::Tensor>> grads(steps);
  for (int s = 0; s < steps; ++s) {
    for (const auto& shape : kShapes) grads[s].push_back((torch::randn(shape) * scale).to(dtype));
  }
  return grads;
}

void set_grads(const Named& named, const std::vector<torch::Tensor>& grads) {
  for (size_t i = 0; i < named.size(); ++i) {
    torch::Tensor p = named[i].second;
    p.mutable_grad() = grads[i].clone();
  }
}

Named clone_named(const Named& named) {
  Named out;
  for (const auto& [name, t] : named) out.emplace_back(name, t.detach().clone().requires_grad_(t.requires_grad()));
  return out;
}

// The GPU optimizer cases: "bf16" precision over fp32 parameters (state in their dtype), fp32-master over bf16 ones;
// weight decay on.
struct GpuCase {
  torch::Dtype dtype;
  AdamWOptions options;
};
GpuCase gpu_case(OptimizerPrecision precision) {
  GpuCase c{precision == OptimizerPrecision::kBf16 ? torch::kFloat32 : torch::kBFloat16, {}};
  c.options.precision = precision;
  c.options.weight_decay = 0.01;
  return c;
}

std::vector<torch::Tensor> tensors_of(const Named& named) {
  std::vector<torch::Tensor> out;
  for (const auto& entry : named) out.push_back(entry.second);
  return out;
}

}  // namespace

TEST_CASE("The ATen reference AdamW matches torch::optim::AdamW over several fp32 steps", "[optimizer]") {
  const double lr = 1e-2, wd = 0.1;  // large enough that decay and bias correction both show
  Named mine = make_params(torch::kFloat32, 1);
  Named theirs = clone_named(mine);
  const auto grads = make_grads(6, torch::kFloat32, 2);

  AdamWOptions options;
  options.betas = {0.9, 0.95};
  options.eps = 1e-8;
  options.weight_decay = wd;
  AdamW opt(mine, options);
  torch::optim::AdamW ref(tensors_of(theirs),
                          torch::optim::AdamWOptions(lr).betas(std::make_tuple(0.9, 0.95)).eps(1e-8).weight_decay(wd));
  for (int s = 0; s < 6; ++s) {
    set_grads(mine, grads[s]);
    set_grads(theirs, grads[s]);
    const auto result = opt.step(lr, /*max_grad_norm=*/0.0);  // no clipping
    ref.step();
    CHECK_FALSE(result.skipped);
    CHECK(result.step == s + 1);
  }
  for (size_t i = 0; i < mine.size(); ++i) {
    INFO(mine[i].first);
    CHECK(rel_err(mine[i].second, theirs[i].second) < 1e-6);
  }
}

TEST_CASE("Clipping scales the gradients so that their global norm is max_norm", "[optimizer]") {
  const double max_norm = 1.0, lr = 1e-3;
  Named mine = make_params(torch::kFloat32, 3);
  Named theirs = clone_named(mine);
  const auto grads = make_grads(1, torch::kFloat32, 4, /*scale=*/10.0);
  double expected_norm = 0;
  for (const auto& g : grads[0]) expected_norm += g.square().sum().item<double>();
  expected_norm = std::sqrt(expected_norm);
  REQUIRE(expected_norm > 10 * max_norm);

  AdamWOptions options;
  options.weight_decay = 0.0;
  AdamW opt(mine, options);
  set_grads(mine, grads[0]);
  const auto result = opt.step(lr, max_norm);
  CHECK(result.grad_norm == Approx(expected_norm).epsilon(1e-6));
  CHECK(result.clip_coef == Approx(max_norm / (expected_norm + 1e-6)).epsilon(1e-6));

  // After one step exp_avg = (1 - beta1) * clipped gradient: its global norm is (1 - beta1) * max_norm.
  double m_norm = 0;
  for (const auto& [name, t] : opt.state_dict().tensors) {
    if (name.rfind("exp_avg.", 0) == 0) m_norm += t.square().sum().item<double>();
  }
  CHECK(std::sqrt(m_norm) / (1 - 0.9) == Approx(max_norm).epsilon(1e-5));

  // And the update is torch's AdamW after torch's clip_grad_norm_.
  set_grads(theirs, grads[0]);
  torch::nn::utils::clip_grad_norm_(tensors_of(theirs), max_norm);
  torch::optim::AdamW ref(tensors_of(theirs),
                          torch::optim::AdamWOptions(lr).betas(std::make_tuple(0.9, 0.95)).eps(1e-8).weight_decay(0));
  ref.step();
  for (size_t i = 0; i < mine.size(); ++i) CHECK(rel_err(mine[i].second, theirs[i].second) < 1e-6);
}

TEST_CASE("A non-finite gradient skips the step and leaves parameters and state unchanged", "[optimizer]") {
  const float bad = GENERATE(std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity());
  Named named = make_params(torch::kFloat32, 5);
  const auto grads = make_grads(3, torch::kFloat32, 6);
  AdamW opt(named, {});
  set_grads(named, grads[0]);
  REQUIRE_FALSE(opt.step(1e-3, 1.0).skipped);

  const Named before = clone_named(named);
  std::vector<torch::Tensor> state_before;
  for (const auto& entry : opt.state_dict().tensors) state_before.push_back(entry.second.clone());

  auto poisoned = grads[1];
  poisoned[2] = poisoned[2].clone();
  poisoned[2].view(-1)[4] = bad;
  set_grads(named, poisoned);
  const auto result = opt.step(1e-3, 1.0);
  CHECK(result.skipped);
  CHECK_FALSE(std::isfinite(result.grad_norm));
  CHECK(result.step == 1);
  CHECK(opt.step_count() == 1);
  CHECK(opt.skipped_steps() == 1);
  for (size_t i = 0; i < named.size(); ++i) CHECK(torch::equal(named[i].second, before[i].second));
  const auto state_after = opt.state_dict().tensors;
  for (size_t i = 0; i < state_after.size(); ++i) CHECK(torch::equal(state_after[i].second, state_before[i]));

  set_grads(named, grads[2]);
  const auto next = opt.step(1e-3, 1.0);
  CHECK_FALSE(next.skipped);
  CHECK(next.step == 2);
}

TEST_CASE("fp32-master keeps the bf16 model copy equal to the rounded master weights", "[optimizer]") {
  const double lr = 1e-2, wd = 0.05;
  Named model = make_params(torch::kBFloat16, 7);
  Named fp32 = make_params(torch::kBFloat16, 7);  // the same bf16 values, as fp32 for torch's optimizer
  for (auto& entry : fp32) entry.second = entry.second.detach().to(torch::kFloat32).requires_grad_(true);
  const auto grads = make_grads(4, torch::kBFloat16, 8);

  AdamWOptions options;
  options.precision = OptimizerPrecision::kFp32Master;
  options.weight_decay = wd;
  AdamW opt(model, options);
  torch::optim::AdamW ref(tensors_of(fp32),
                          torch::optim::AdamWOptions(lr).betas(std::make_tuple(0.9, 0.95)).eps(1e-8).weight_decay(wd));
  for (int s = 0; s < 4; ++s) {
    set_grads(model, grads[s]);
    std::vector<torch::Tensor> g32;
    for (const auto& g : grads[s]) g32.push_back(g.to(torch::kFloat32));
    set_grads(fp32, g32);
    REQUIRE_FALSE(opt.step(lr, 0.0).skipped);
    ref.step();
  }
  const auto state = opt.state_dict();
  CHECK(state.precision == "fp32-master");
  size_t masters = 0;
  for (const auto& [name, t] : state.tensors) {
    if (name.rfind("master.", 0) != 0) {
      CHECK(t.scalar_type() == torch::kFloat32);  // fp32 state
      continue;
    }
    ++masters;
    const std::string fqn = name.substr(7);
    for (size_t i = 0; i < model.size(); ++i) {
      if (model[i].first != fqn) continue;
      INFO(fqn);
      CHECK(model[i].second.scalar_type() == torch::kBFloat16);
      CHECK(torch::equal(model[i].second, t.to(torch::kBFloat16)));
      CHECK(rel_err(t, fp32[i].second) < 1e-6);
    }
  }
  CHECK(masters == model.size());
}

TEST_CASE("bf16 precision keeps the AdamW state in bf16 and stays near the fp32 result", "[optimizer]") {
  const double lr = 1e-2;
  Named model = make_params(torch::kBFloat16, 9);
  Named fp32 = clone_named(model);
  for (auto& entry : fp32) entry.second = entry.second.detach().to(torch::kFloat32).requires_grad_(true);
  const auto grads = make_grads(3, torch::kBFloat16, 10);
  AdamW opt(model, {});
  AdamW opt32(fp32, {});
  for (int s = 0; s < 3; ++s) {
    set_grads(model, grads[s]);
    std::vector<torch::Tensor> g32;
    for (const auto& g : grads[s]) g32.push_back(g.to(torch::kFloat32));
    set_grads(fp32, g32);
    opt.step(lr, 1.0);
    opt32.step(lr, 1.0);
  }
  for (const auto& entry : opt.state_dict().tensors) CHECK(entry.second.scalar_type() == torch::kBFloat16);
  for (size_t i = 0; i < model.size(); ++i) CHECK(rel_err(model[i].second, fp32[i].second) < 1e-2);
}

TEST_CASE("The optimizer state round-trips through state_dict and continues bit-exactly", "[optimizer]") {
  const auto precision = GENERATE(OptimizerPrecision::kBf16, OptimizerPrecision::kFp32Master);
  const auto dtype = precision == OptimizerPrecision::kBf16 ? torch::kFloat32 : torch::kBFloat16;
  AdamWOptions options;
  options.precision = precision;
  options.weight_decay = 0.01;
  const auto grads = make_grads(6, dtype, 12, /*scale=*/3.0);

  Named straight = make_params(dtype, 11);
  AdamW opt(straight, options);
  for (int s = 0; s < 3; ++s) {
    set_grads(straight, grads[s]);
    opt.step(1e-3 * (s + 1), 1.0);
  }
  // Checkpoint: weights and optimizer state, copied as a checkpoint writer would.
  const Named weights = clone_named(straight);
  auto saved = opt.state_dict();
  for (auto& entry : saved.tensors) entry.second = entry.second.clone();
  for (int s = 3; s < 6; ++s) {
    set_grads(straight, grads[s]);
    opt.step(1e-3 * (s + 1), 1.0);
  }

  Named resumed = clone_named(weights);
  AdamW opt2(resumed, options);
  opt2.load_state_dict(saved);
  CHECK(opt2.step_count() == 3);
  for (int s = 3; s < 6; ++s) {
    set_grads(resumed, grads[s]);
    opt2.step(1e-3 * (s + 1), 1.0);
  }
  CHECK(opt2.step_count() == 6);
  for (size_t i = 0; i < straight.size(); ++i) CHECK(torch::equal(straight[i].second, resumed[i].second));
  const auto a = opt.state_dict().tensors, b = opt2.state_dict().tensors;
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) CHECK(torch::equal(a[i].second, b[i].second));

  SECTION("a state for another precision or with a missing tensor is refused, naming it") {
    auto wrong = saved;
    wrong.precision = precision == OptimizerPrecision::kBf16 ? "fp32-master" : "bf16";
    CHECK_THROWS_WITH(opt2.load_state_dict(wrong), Catch::Contains("precision"));
    auto missing = saved;
    const std::string dropped = missing.tensors.front().first;
    missing.tensors.erase(missing.tensors.begin());
    CHECK_THROWS_WITH(opt2.load_state_dict(missing), Catch::Contains(dropped));
  }
}

TEST_CASE("A parameter without a gradient is updated as with a zero gradient", "[optimizer]") {
  Named a = make_params(torch::kFloat32, 13);
  Named b = clone_named(a);
  auto grads = make_grads(2, torch::kFloat32, 14);
  AdamW opt_a(a, {}), opt_b(b, {});
  for (int s = 0; s < 2; ++s) {
    set_grads(a, grads[s]);
    set_grads(b, grads[s]);
    if (s == 1) {
      a[1].second.mutable_grad().reset();  // missing
      b[1].second.mutable_grad() = torch::zeros_like(b[1].second);
    }
    opt_a.step(1e-2, 1.0);
    opt_b.step(1e-2, 1.0);
  }
  for (size_t i = 0; i < a.size(); ++i) CHECK(torch::equal(a[i].second, b[i].second));
}

TEST_CASE("The no-decay predicate exempts its parameters from weight decay", "[optimizer]") {
  Named named = make_params(torch::kFloat32, 15);
  const Named before = clone_named(named);
  AdamWOptions options;
  options.weight_decay = 0.5;
  options.no_decay = [](const std::string& fqn) { return fqn.size() >= 5 && fqn.substr(fqn.size() - 5) == ".bias"; };
  AdamW opt(named, options);
  // Zero gradients on the first step: m = v = 0, so the only change is the decay p *= 1 - lr * wd.
  for (auto& [name, p] : named) p.mutable_grad() = torch::zeros_like(p);
  opt.step(0.1, 1.0);
  for (size_t i = 0; i < named.size(); ++i) {
    INFO(named[i].first);
    CHECK(opt.decays(i) == (kShapes[i].size() != 1));
    const torch::Tensor expected = opt.decays(i) ? before[i].second * (1 - 0.1 * 0.5) : before[i].second;
    CHECK(torch::allclose(named[i].second, expected, 1e-7, 0));
  }
}

TEST_CASE("adamw_step rejects inputs with a message naming the tensor", "[optimizer]") {
  std::vector<torch::Tensor> p = {torch::zeros({4}), torch::zeros({2, 3})};
  std::vector<torch::Tensor> g = {torch::zeros({4}), torch::zeros({2, 3})};
  std::vector<torch::Tensor> m = {torch::zeros({4}), torch::zeros({2, 3}, torch::kBFloat16)};
  std::vector<torch::Tensor> v = {torch::zeros({4}), torch::zeros({2, 3})};
  vlatune::kernels::AdamwParams hp;
  hp.lr = 1e-3;
  CHECK_THROWS_WITH(vlatune::kernels::adamw_step(p, g, m, v, nullptr, hp),
                    Catch::Contains("exp_avg[1] must be a contiguous f32 [2, 3]") && Catch::Contains("got bf16"));
  m[1] = torch::zeros({2, 3});
  g[0] = torch::zeros({5});
  CHECK_THROWS_WITH(vlatune::kernels::adamw_step(p, g, m, v, nullptr, hp), Catch::Contains("grads[0]"));
  g[0] = torch::zeros({4});
  v.pop_back();
  CHECK_THROWS_WITH(vlatune::kernels::adamw_step(p, g, m, v, nullptr, hp), Catch::Contains("exp_avg_sq has 1"));
}

TEST_CASE("global_grad_norm is the L2 norm over all gradients, skipping missing ones", "[optimizer]") {
  torch::manual_seed(16);
  std::vector<torch::Tensor> grads = {torch::randn({7, 3}), torch::Tensor(), torch::randn({5}).to(torch::kBFloat16)};
  const double expected =
      std::sqrt(grads[0].square().sum().item<double>() + grads[2].to(torch::kFloat32).square().sum().item<double>());
  const torch::Tensor norm = vlatune::kernels::global_grad_norm(grads);
  CHECK(norm.dim() == 0);
  CHECK(norm.scalar_type() == torch::kFloat32);
  CHECK(norm.item<double>() == Approx(expected).epsilon(1e-6));
  CHECK(vlatune::kernels::global_grad_norm({torch::Tensor()}).item<double>() == 0.0);
}

TEST_CASE("EMA follows shadow = decay * shadow + (1 - decay) * param in fp32", "[optimizer][ema]") {
  torch::manual_seed(17);
  torch::Tensor w = torch::randn({4, 3}).to(torch::kBFloat16);
  torch::Tensor b = torch::randn({3});
  const torch::Tensor w0 = w.to(torch::kFloat32), b0 = b.clone();
  vlatune::trainer::Ema ema({{"w", w}, {"b", b}}, 0.9);
  CHECK(torch::equal(ema.state()[0].second, w0));

  w.add_(1.0);
  b.mul_(2.0);
  ema.update();
  const torch::Tensor w1 = 0.9 * w0 + 0.1 * w.to(torch::kFloat32);
  const torch::Tensor b1 = 0.9 * b0 + 0.1 * b;
  CHECK(ema.state()[0].second.scalar_type() == torch::kFloat32);
  CHECK(torch::allclose(ema.state()[0].second, w1, 1e-6, 1e-7));
  CHECK(torch::allclose(ema.state()[1].second, b1, 1e-6, 1e-7));
  ema.update();  // params unchanged: the shadow moves 10% further towards them
  CHECK(torch::allclose(ema.state()[1].second, 0.9 * b1 + 0.1 * b, 1e-6, 1e-7));

  // Checkpoint round trip and apply_to.
  std::vector<std::pair<std::string, torch::Tensor>> saved;
  for (const auto& [name, t] : ema.state()) saved.emplace_back(name, t.clone());
  vlatune::trainer::Ema other({{"w", w}, {"b", b}}, 0.9);
  other.load_state(saved);
  CHECK(torch::equal(other.state()[1].second, saved[1].second));
  torch::Tensor out_w = torch::empty({4, 3}, torch::kBFloat16), out_b = torch::empty({3});
  other.apply_to({{"w", out_w}, {"b", out_b}});
  CHECK(torch::equal(out_w, saved[0].second.to(torch::kBFloat16)));
  CHECK(torch::equal(out_b, saved[1].second));
  CHECK_THROWS_WITH(other.apply_to({{"nope", out_b}}), Catch::Contains("'nope'"));
}

// ---------------------------------------------------------------------------------------------- GPU ([.gpu])

namespace {

// Sizes around the vector width (4), the chunk (65536) and odd primes; the long list (> 192 tensors) forces several
// launches through the tensor table, the big tensor (> 1536 chunks) through the block table mid-tensor.
std::vector<int64_t> gpu_sizes(bool with_big) {
  std::vector<int64_t> sizes = {1, 3, 4, 5, 7, 8, 1000, 1023, 4097, 65535, 65536, 65537, 200003, 3 * 65536 + 5};
  for (int i = 0; i < 250; ++i) sizes.push_back(1 + (i * 7919) % 5003);
  if (with_big) sizes.push_back(3100LL * 65536 + 17);
  return sizes;
}

// A contiguous tensor whose data pointer is one element past an aligned address: the kernels' scalar path.
torch::Tensor misaligned(int64_t n, const torch::TensorOptions& opts) {
  return torch::empty({n + 1}, opts).narrow(0, 1, n);
}

}  // namespace

TEST_CASE("The fused CUDA AdamW matches the ATen reference for every storage", "[.gpu][optimizer]") {
  REQUIRE(torch::cuda::is_available());
  using vlatune::kernels::AdamwStorage;
  const auto storage = GENERATE(AdamwStorage::kFp32, AdamwStorage::kBf16, AdamwStorage::kFp32Master);
  INFO("storage " << vlatune::kernels::adamw_storage_name(storage));
  torch::manual_seed(20);
  const auto dev = torch::TensorOptions().device(torch::kCUDA);
  const auto p_dtype = storage == AdamwStorage::kFp32 ? torch::kFloat32 : torch::kBFloat16;
  const auto s_dtype = storage == AdamwStorage::kBf16 ? torch::kBFloat16 : torch::kFloat32;
  const bool master_mode = storage == AdamwStorage::kFp32Master;

  const auto sizes = gpu_sizes(/*with_big=*/true);
  std::vector<torch::Tensor> p, m, v, master;
  for (size_t i = 0; i < sizes.size(); ++i) {
    // Every 10th tensor is misaligned (scalar path); the rest come from the allocator (vector path).
    auto make = [&](torch::Dtype dtype) {
      torch::Tensor t =
          i % 10 == 3 ? misaligned(sizes[i], dev.dtype(dtype)) : torch::empty({sizes[i]}, dev.dtype(dtype));
      return t;
    };
    torch::Tensor init = torch::randn({sizes[i]}, dev);
    if (master_mode) {
      master.push_back(make(torch::kFloat32).copy_(init));
      p.push_back(make(torch::kBFloat16).copy_(init));
    } else {
      p.push_back(make(p_dtype).copy_(init));
    }
    m.push_back(make(s_dtype).copy_(torch::randn({sizes[i]}, dev) * 0.1));
    v.push_back(make(s_dtype).copy_(torch::rand({sizes[i]}, dev) * 0.01));
  }
  auto clone_all = [](const std::vector<torch::Tensor>& ts) {
    std::vector<torch::Tensor> out;
    for (const auto& t : ts) out.push_back(t.clone());
    return out;
  };
  auto rp = clone_all(p), rm = clone_all(m), rv = clone_all(v), rmaster = clone_all(master);

  vlatune::kernels::AdamwParams hp;
  hp.lr = 1e-3;
  hp.weight_decay = 0.01;
  hp.grad_scale = 0.75;
  const torch::Tensor scale = torch::full({}, 0.5f, dev.dtype(torch::kFloat32));
  for (int step = 1; step <= 3; ++step) {
    hp.step = step;
    std::vector<torch::Tensor> g;
    for (size_t i = 0; i < sizes.size(); ++i) {
      g.push_back(i == 5 ? torch::Tensor()
                         : torch::randn({sizes[i]}, dev).to(master_mode ? torch::kBFloat16 : p_dtype));
    }
    vlatune::kernels::adamw_step(p, g, m, v, master_mode ? &master : nullptr, hp, scale);
    vlatune::kernels::adamw_step_ref(rp, g, rm, rv, master_mode ? &rmaster : nullptr, hp, scale);
  }
  torch::cuda::synchronize();
  // fp32: same math up to FMA contraction; bf16 storage: within 1-2 bf16 ulp of the reference.
  const double bound = storage == AdamwStorage::kBf16 ? 1e-2 : 1e-6;
  for (size_t i = 0; i < sizes.size(); ++i) {
    INFO("tensor " << i << " of size " << sizes[i]);
    const torch::Tensor& out_p = master_mode ? master[i] : p[i];
    const torch::Tensor& ref_p = master_mode ? rmaster[i] : rp[i];
    CHECK(rel_err(out_p, ref_p) < bound);
    CHECK(rel_err(m[i], rm[i]) < bound);
    CHECK(rel_err(v[i], rv[i]) < bound);
    if (master_mode) CHECK(torch::equal(p[i], master[i].to(torch::kBFloat16)));
  }
}

TEST_CASE("The fused CUDA AdamW writes nothing when the device grad scale is not finite", "[.gpu][optimizer]") {
  REQUIRE(torch::cuda::is_available());
  const auto dev = torch::TensorOptions().device(torch::kCUDA);
  std::vector<torch::Tensor> p = {torch::randn({1000}, dev), torch::randn({65537}, dev)};
  std::vector<torch::Tensor> g = {torch::randn({1000}, dev), torch::randn({65537}, dev)};
  std::vector<torch::Tensor> m = {torch::zeros({1000}, dev), torch::zeros({65537}, dev)};
  std::vector<torch::Tensor> v = {torch::zeros({1000}, dev), torch::zeros({65537}, dev)};
  const std::vector<torch::Tensor> p0 = {p[0].clone(), p[1].clone()};
  vlatune::kernels::AdamwParams hp;
  hp.lr = 1e-2;
  vlatune::kernels::adamw_step(p, g, m, v, nullptr, hp, torch::full({}, NAN, dev));
  torch::cuda::synchronize();
  for (size_t i = 0; i < p.size(); ++i) {
    CHECK(torch::equal(p[i], p0[i]));
    CHECK(m[i].abs().max().item<float>() == 0.0f);
  }
}

TEST_CASE("The fused CUDA norm matches ATen and is deterministic", "[.gpu][optimizer]") {
  REQUIRE(torch::cuda::is_available());
  const auto dtype = GENERATE(torch::kFloat32, torch::kBFloat16);
  torch::manual_seed(21);
  const auto dev = torch::TensorOptions().device(torch::kCUDA).dtype(dtype);
  std::vector<torch::Tensor> grads;
  const auto sizes = gpu_sizes(/*with_big=*/true);
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (i == 7) {
      grads.emplace_back();  // a missing gradient
      continue;
    }
    torch::Tensor t = i % 10 == 3 ? misaligned(sizes[i], dev) : torch::empty({sizes[i]}, dev);
    grads.push_back(t.copy_(torch::randn({sizes[i]}, torch::TensorOptions().device(torch::kCUDA))));
  }
  const torch::Tensor fused = vlatune::kernels::global_grad_norm(grads);
  CHECK(fused.is_cuda());
  CHECK(fused.dim() == 0);
  double ref = 0;  // fp64 on the host
  for (const auto& g : grads) {
    if (g.defined()) ref += g.to(torch::kFloat64).square().sum().item<double>();
  }
  ref = std::sqrt(ref);
  CHECK(fused.item<double>() == Approx(ref).epsilon(1e-5));
  CHECK(rel_err(fused, vlatune::kernels::global_grad_norm_ref(grads)) < 1e-5);
  CHECK(torch::equal(fused, vlatune::kernels::global_grad_norm(grads)));  // no atomics: bitwise repeatable
}

TEST_CASE("The trainer AdamW on the GPU matches the same optimizer on the CPU", "[.gpu][optimizer]") {
  REQUIRE(torch::cuda::is_available());
  const auto [dtype, options] = gpu_case(GENERATE(OptimizerPrecision::kBf16, OptimizerPrecision::kFp32Master));
  Named cpu = make_params(dtype, 22);
  Named gpu;
  for (const auto& [name, t] : cpu) gpu.emplace_back(name, t.detach().to(torch::kCUDA).requires_grad_(true));
  const auto grads = make_grads(4, dtype, 23, /*scale=*/5.0);
  AdamW opt_cpu(cpu, options), opt_gpu(gpu, options);
  for (int s = 0; s < 4; ++s) {
    set_grads(cpu, grads[s]);
    std::vector<torch::Tensor> g;
    for (const auto& t : grads[s]) g.push_back(t.to(torch::kCUDA));
    set_grads(gpu, g);
    const auto a = opt_cpu.step(1e-2, 1.0), b = opt_gpu.step(1e-2, 1.0);
    CHECK(b.grad_norm == Approx(a.grad_norm).epsilon(1e-5));
  }
  const double bound = dtype == torch::kBFloat16 ? 1e-2 : 1e-6;
  for (size_t i = 0; i < cpu.size(); ++i) CHECK(rel_err(gpu[i].second.cpu(), cpu[i].second) < bound);
}

TEST_CASE("step() is queue_update then finish_update, and a device schedule needs CUDA", "[optimizer]") {
  AdamWOptions options;
  options.weight_decay = 0.01;
  Named a = make_params(torch::kFloat32, 31), b = clone_named(a);
  AdamW opt_a(a, options), opt_b(b, options);
  const auto grads = make_grads(3, torch::kFloat32, 32, /*scale=*/3.0);
  for (int s = 0; s < 3; ++s) {
    set_grads(a, grads[s]);
    set_grads(b, grads[s]);
    const double lr = 1e-2 * (s + 1);
    const auto ra = opt_a.step(lr, 1.0);
    const torch::Tensor norm = opt_b.queue_update(lr, 1.0, /*device_schedule=*/false);
    const auto rb = opt_b.finish_update(lr, 1.0, norm);
    CHECK(ra.grad_norm == rb.grad_norm);
    CHECK(ra.step == rb.step);
    CHECK(rb.step == s + 1);
  }
  for (size_t i = 0; i < a.size(); ++i) CHECK(torch::equal(a[i].second, b[i].second));
  CHECK_THROWS_WITH(opt_b.write_device_schedule(1e-3), Catch::Contains("needs CUDA parameters"));
  CHECK_THROWS_WITH(opt_b.queue_update(1e-3, 1.0, /*device_schedule=*/true), Catch::Contains("needs CUDA parameters"));
}

namespace {

// Two optimizers over the same parameters and gradients, with a non-finite gradient at steps 1 and 2: one reads
// every norm before queuing the next update, the other queues update s + 1 with update s in flight and reads s
// afterwards. The bias corrections count the updates that were not skipped, so the update after a skipped one
// differs unless the in-flight skip is taken into account; the parameters must come out identical.
void check_in_flight_updates(torch::Device device) {
  auto [dtype, options] = gpu_case(OptimizerPrecision::kBf16);
  options.no_decay = [](const std::string& name) { return name.find("bias") != std::string::npos; };  // 2 groups
  Named read, queued;
  for (const auto& [name, t] : make_params(dtype, 35)) {
    read.emplace_back(name, t.detach().to(device).requires_grad_(true));
    queued.emplace_back(name, t.detach().to(device).requires_grad_(true));
  }
  constexpr int kSteps = 6;
  auto grads = make_grads(kSteps, dtype, 36, /*scale=*/5.0);
  for (int s : {1, 2}) grads[s][0][0] = std::numeric_limits<double>::quiet_NaN();
  auto to_device = [&](const std::vector<torch::Tensor>& g) {
    std::vector<torch::Tensor> out;
    for (const auto& t : g) out.push_back(t.to(device));
    return out;
  };
  AdamW opt_read(read, options), opt_queued(queued, options);
  std::vector<vlatune::trainer::StepResult> expected;
  for (int s = 0; s < kSteps; ++s) {
    set_grads(read, to_device(grads[s]));
    expected.push_back(opt_read.step(1e-2, 1.0));
    opt_read.zero_grad();
  }
  torch::Tensor in_flight;
  double in_flight_lr = 0.0;
  for (int s = 0; s <= kSteps; ++s) {
    torch::Tensor norm;
    if (s < kSteps) {
      set_grads(queued, to_device(grads[s]));
      norm = opt_queued.queue_update(1e-2, 1.0, /*device_schedule=*/false, in_flight);
      opt_queued.zero_grad();
    }
    if (in_flight.defined()) {
      const auto r = opt_queued.finish_update(in_flight_lr, 1.0, in_flight);
      const auto& e = expected[static_cast<size_t>(s - 1)];
      CHECK(r.skipped == e.skipped);
      CHECK(r.step == e.step);
    }
    in_flight = norm;
    in_flight_lr = 1e-2;
  }
  CHECK(expected.back().step == kSteps - 2);
  for (size_t i = 0; i < read.size(); ++i) {
    INFO(read[i].first);
    CHECK(torch::equal(read[i].second, queued[i].second));
  }
}

}  // namespace

TEST_CASE("An update queued while the previous one is in flight is the one a loop reading every norm makes",
          "[optimizer]") {
  check_in_flight_updates(torch::kCPU);
}

TEST_CASE("On the GPU the device picks the bias correction of an update queued behind one in flight",
          "[.gpu][optimizer]") {
  REQUIRE(torch::cuda::is_available());
  check_in_flight_updates(torch::kCUDA);
}

TEST_CASE("adamw_step_scalars rounds lr, decay and bias corrections from doubles once", "[optimizer]") {
  vlatune::kernels::AdamwParams hp;
  hp.lr = 3e-4;
  hp.weight_decay = 0.1;
  hp.beta1 = 0.9;
  hp.beta2 = 0.95;
  hp.step = 7;
  const auto s = vlatune::kernels::adamw_step_scalars(hp);
  CHECK(s.decay == static_cast<float>(1.0 - 3e-4 * 0.1));
  CHECK(s.step_size == static_cast<float>(3e-4 / (1.0 - std::pow(0.9, 7.0))));
  CHECK(s.bc2_sqrt == static_cast<float>(std::sqrt(1.0 - std::pow(0.95, 7.0))));
}

TEST_CASE("The fused CUDA AdamW reads a device schedule bit-identically to its launch scalars", "[.gpu][optimizer]") {
  REQUIRE(torch::cuda::is_available());
  auto [dtype, options] = gpu_case(GENERATE(OptimizerPrecision::kBf16, OptimizerPrecision::kFp32Master));
  options.no_decay = [](const std::string& name) { return name.find("bias") != std::string::npos; };  // 2 groups
  Named host, device;
  for (const auto& [name, t] : make_params(dtype, 33)) {
    host.emplace_back(name, t.detach().to(torch::kCUDA).requires_grad_(true));
    device.emplace_back(name, t.detach().to(torch::kCUDA).requires_grad_(true));
  }
  const auto grads = make_grads(4, dtype, 34, /*scale=*/5.0);
  AdamW opt_host(host, options), opt_device(device, options);
  for (int s = 0; s < 4; ++s) {
    std::vector<torch::Tensor> g;
    for (const auto& t : grads[s]) g.push_back(t.to(torch::kCUDA));
    set_grads(host, g);
    set_grads(device, g);
    const double lr = 1e-2 / (s + 1);  // changes every step: a stale schedule would show
    const auto a = opt_host.step(lr, 1.0);
    opt_device.write_device_schedule(lr);
    const auto b = opt_device.finish_update(lr, 1.0, opt_device.queue_update(/*lr=*/0.0, 1.0, true));
    opt_host.zero_grad();
    opt_device.zero_grad();
    CHECK(a.grad_norm == b.grad_norm);
    CHECK(a.step == b.step);
  }
  for (size_t i = 0; i < host.size(); ++i) {
    INFO(host[i].first);
    CHECK(torch::equal(host[i].second, device[i].second));
  }
}
