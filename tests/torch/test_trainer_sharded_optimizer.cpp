// Optimizer state sharded over the data-parallel ranks (ZeRO-1: trainer/shard_layout.h, the sharded AdamW of
// trainer/optimizer.h, trainer/grad_buckets.h "sharded"):
//   - the layout: equal shards on 256-value blocks of every parameter, ranges that partition each parameter;
//   - a sharded AdamW, rank by rank in one process, updates its ranges exactly as one unsharded AdamW updates the
//     whole parameters (fp32 and 8-bit state, fp32 master weights), holds 1/N of the state, and continues from an
//     unsharded state exactly;
//   - `vlatune launch --nproc N -- train` with distributed.shard_optimizer_state over Gloo (2 and 3 ranks) gives the
//     unsharded run's weights, losses and gradient norms bit for bit, and a resumed sharded run equals one that ran
//     through.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include "dist_test_util.h"
#include "temp_dir.h"

#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "formats/metrics_jsonl.h"
#include "trainer/optimizer.h"
#include "trainer/shard_layout.h"

namespace {

using vlatune::trainer::AdamW;
using vlatune::trainer::AdamWOptions;
using vlatune::trainer::ParamRange;
using vlatune::trainer::ShardedGradients;

// Parameters of awkward sizes (none a multiple of 256, one under a block, one of several blocks).
std::vector<std::pair<std::string, torch::Tensor>> make_params(torch::Dtype dtype) {
  const std::vector<std::vector<int64_t>> shapes = {{37, 29}, {5}, {4099}, {3, 300}, {1000}};
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (size_t i = 0; i < shapes.size(); ++i) {
    torch::Tensor p = (torch::randn(shapes[i], torch::TensorOptions().dtype(torch::kFloat64)) * 0.1).to(dtype);
    out.emplace_back("p" + std::to_string(i), p.requires_grad_());
  }
  return out;
}

std::vector<std::pair<std::string, torch::Tensor>> clone_params(
    const std::vector<std::pair<std::string, torch::Tensor>>& params) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& [name, p] : params) out.emplace_back(name, p.detach().clone().requires_grad_());
  return out;
}

std::vector<int64_t> numels_of(const std::vector<std::pair<std::string, torch::Tensor>>& params) {
  std::vector<int64_t> out;
  for (const auto& [name, p] : params) out.push_back(p.numel());
  return out;
}

// Rank `rank`'s range of each parameter under the shard layout of `numels` over `world` ranks.
std::vector<ParamRange> rank_ranges(const std::vector<int64_t>& numels, int world, int rank) {
  const auto layout = vlatune::trainer::shard_layout(numels, world);
  std::vector<ParamRange> out;
  for (size_t i = 0; i < numels.size(); ++i) out.push_back(vlatune::trainer::shard_range(layout, i, numels[i], rank));
  return out;
}

// Gradient sources for a sharded AdamW whose every .grad holds the whole gradient, as over Gloo: each range is read
// from its parameter's .grad. `params` must outlive the optimizer.
ShardedGradients whole_gradient_sources(const std::vector<std::pair<std::string, torch::Tensor>>& params,
                                        std::vector<ParamRange> ranges) {
  ShardedGradients sources;
  sources.range_gradient = [&params, ranges = std::move(ranges)](size_t i) {
    return params[i].second.grad().view({-1}).narrow(0, ranges[i].start, ranges[i].length);
  };
  sources.whole_gradients = true;
  return sources;
}

}  // namespace

TEST_CASE("The shard layout: equal shards on 256-value blocks, ranges that partition every parameter",
          "[trainer][zero]") {
  const std::vector<int64_t> numels = {1000, 5, 4099, 256, 1};
  for (int world : {1, 2, 3, 8}) {
    const auto layout = vlatune::trainer::shard_layout(numels, world);
    INFO("world " << world);
    CHECK(layout.padded_numel == layout.shard_numel * world);
    CHECK(layout.shard_numel % vlatune::trainer::kShardAlign == 0);
    for (size_t i = 0; i < numels.size(); ++i) {
      CHECK(layout.offset[i] % vlatune::trainer::kShardAlign == 0);
      int64_t covered = 0;
      for (int rank = 0; rank < world; ++rank) {
        const ParamRange r = vlatune::trainer::shard_range(layout, i, numels[i], rank);
        if (r.length == 0) continue;
        CHECK(r.start == covered);  // ranks in order, no gap, no overlap
        CHECK(r.start % vlatune::trainer::kShardAlign == 0);
        covered += r.length;
      }
      CHECK(covered == numels[i]);
    }
  }
  CHECK(vlatune::trainer::shard_layout({1000, 5}, 2).offset == std::vector<int64_t>{0, 1024});
  CHECK(vlatune::trainer::shard_layout({1000, 5}, 2).shard_numel == 768);
}

TEST_CASE("Sharded AdamW: each rank's ranges updated as the unsharded step updates them, 1/N of the state each",
          "[trainer][zero][optimizer]") {
  struct Setting {
    const char* label;
    torch::Dtype dtype;
    vlatune::trainer::OptimizerPrecision precision;
    vlatune::trainer::OptimizerStateDtype state;
  };
  using vlatune::trainer::OptimizerPrecision;
  using vlatune::trainer::OptimizerStateDtype;
  const std::vector<Setting> settings = {
      {"fp32", torch::kFloat32, OptimizerPrecision::kBf16, OptimizerStateDtype::kAuto},
      {"8-bit state", torch::kFloat32, OptimizerPrecision::kBf16, OptimizerStateDtype::kInt8Blockwise},
      {"bf16 + fp32 master, 8-bit state", torch::kBFloat16, OptimizerPrecision::kFp32Master,
       OptimizerStateDtype::kInt8Blockwise},
  };
  for (const Setting& setting : settings) {
    for (const int world : {2, 3}) {
      INFO(setting.label << ", " << world << " ranks");
      torch::manual_seed(7);
      const auto start = make_params(setting.dtype);
      std::vector<std::vector<torch::Tensor>> grads;  // per step, per parameter
      for (int step = 0; step < 3; ++step) {
        grads.emplace_back();
        for (const auto& [name, p] : start)
          grads.back().push_back(torch::randn_like(p, torch::kFloat32).to(p.scalar_type()));
      }
      AdamWOptions options;
      options.precision = setting.precision;
      options.state_dtype = setting.state;
      options.int8_min_numel = 1000;  // p1 (5) and p3 (900) keep full-precision moments
      auto step_all = [&](AdamW& opt, std::vector<std::pair<std::string, torch::Tensor>>& params, int step) {
        for (size_t i = 0; i < params.size(); ++i) params[i].second.mutable_grad() = grads[step][i].clone();
        // Clipping active (the random gradients' norm is far above 0.5): the coefficient enters every update.
        const auto result = opt.step(1e-2, 0.5);
        opt.zero_grad();
        return result;
      };

      auto whole = clone_params(start);
      AdamW unsharded(whole, options);
      std::vector<double> norms;
      for (int step = 0; step < 3; ++step) norms.push_back(step_all(unsharded, whole, step).grad_norm);

      const std::vector<int64_t> numels = numels_of(start);
      int64_t bytes = 0;
      std::vector<torch::Tensor> assembled;
      for (const auto& [name, p] : start) assembled.push_back(torch::empty_like(p).view({-1}));
      for (int rank = 0; rank < world; ++rank) {
        auto mine = clone_params(start);
        const std::vector<ParamRange> ranges = rank_ranges(numels, world, rank);
        const ShardedGradients sources = whole_gradient_sources(mine, ranges);
        AdamW sharded(mine, options, ranges, sources);
        CHECK(sharded.sharded());
        bytes += sharded.state_bytes();
        CHECK(static_cast<double>(sharded.state_bytes()) <= unsharded.state_bytes() / world + 2.0 * 4 * 256 * 6);
        for (int step = 0; step < 3; ++step) CHECK(step_all(sharded, mine, step).grad_norm == norms[step]);
        for (size_t i = 0; i < mine.size(); ++i)
          if (ranges[i].length > 0)
            assembled[i]
                .narrow(0, ranges[i].start, ranges[i].length)
                .copy_(mine[i].second.detach().view({-1}).narrow(0, ranges[i].start, ranges[i].length));
        CHECK_THROWS_WITH(sharded.state_dict(), Catch::Contains("state_dict(gather)"));

        // From the unsharded state (a checkpoint's), this rank's ranges continue exactly as the unsharded run.
        auto resumed = clone_params(whole);
        AdamW continued(resumed, options, ranges, sources);
        continued.load_state_dict(unsharded.state_dict());
        CHECK(continued.step_count() == 3);
      }
      CHECK(bytes == unsharded.state_bytes());  // the ranges partition every parameter and every 256-value block
      for (size_t i = 0; i < whole.size(); ++i) {
        INFO(whole[i].first);
        CHECK(torch::equal(assembled[i].view(whole[i].second.sizes()), whole[i].second.detach()));
      }
    }
  }
}

TEST_CASE("A sharded AdamW resumed from the whole state continues exactly as the unsharded one",
          "[trainer][zero][optimizer]") {
  torch::manual_seed(11);
  const auto start = make_params(torch::kFloat32);
  AdamWOptions options;
  options.state_dtype = vlatune::trainer::OptimizerStateDtype::kInt8Blockwise;
  options.int8_min_numel = 1000;
  std::vector<std::vector<torch::Tensor>> grads;
  for (int step = 0; step < 4; ++step) {
    grads.emplace_back();
    for (const auto& [name, p] : start) grads.back().push_back(torch::randn_like(p));
  }
  auto run = [&](AdamW& opt, std::vector<std::pair<std::string, torch::Tensor>>& params, int from, int to) {
    for (int step = from; step < to; ++step) {
      for (size_t i = 0; i < params.size(); ++i) params[i].second.mutable_grad() = grads[step][i].clone();
      opt.step(1e-2, 1.0);
      opt.zero_grad();
    }
  };
  auto whole = clone_params(start);
  AdamW unsharded(whole, options);
  run(unsharded, whole, 0, 2);
  const auto checkpoint_params = clone_params(whole);
  vlatune::trainer::OptimizerState checkpoint;
  checkpoint.precision = unsharded.state_dict().precision;
  checkpoint.scalars = unsharded.state_dict().scalars;
  for (const auto& [name, t] : unsharded.state_dict().tensors) checkpoint.tensors.emplace_back(name, t.clone());
  run(unsharded, whole, 2, 4);

  const std::vector<int64_t> numels = numels_of(start);
  for (int rank = 0; rank < 2; ++rank) {
    auto mine = clone_params(checkpoint_params);
    const std::vector<ParamRange> ranges = rank_ranges(numels, 2, rank);
    AdamW sharded(mine, options, ranges, whole_gradient_sources(mine, ranges));
    sharded.load_state_dict(checkpoint);
    run(sharded, mine, 2, 4);
    for (size_t i = 0; i < mine.size(); ++i) {
      const auto a = mine[i].second.detach().view({-1}).narrow(0, ranges[i].start, ranges[i].length);
      const auto b = whole[i].second.detach().view({-1}).narrow(0, ranges[i].start, ranges[i].length);
      INFO("rank " << rank << ", " << mine[i].first);
      CHECK(torch::equal(a, b));
    }
  }
}

#ifdef VLATUNE_HAVE_GLOO

namespace {

const char* kTrainArgs =
    "--config tiny --device cpu --data synthetic --batch 2 --lr 1e-4 --warmup-steps 1 --decay-steps 100 "
    "--workers 1 --no-progress --seed 5 --timing-warmup 0";

// `vlatune launch --nproc N -- train ARGS`, logged to `log`; the run must pass. Returns the log.
std::string launch_train(int world, const std::string& log, const std::string& args) {
  const int rc = vlatune::test::run_vlatune("launch --nproc " + std::to_string(world) + " --master-port " +
                                                std::to_string(vlatune::test::free_port()) + " -- train " + args,
                                            log);
  const std::string text = vlatune::test::read_text(log);
  INFO(text);
  REQUIRE(rc == 0);
  return text;
}

void require_same_weights(const std::string& a, const std::string& b) {
  const auto wa = vlatune::test::load_weights(a + "/final/model.safetensors");
  const auto wb = vlatune::test::load_weights(b + "/final/model.safetensors");
  REQUIRE(wa.size() == wb.size());
  for (const auto& [name, t] : wa) {
    INFO(name);
    REQUIRE(wb.count(name) == 1);
    CHECK(torch::equal(t, wb.at(name)));
  }
}

void require_same_metrics(const std::string& a, const std::string& b) {
  const auto ma = vlatune::formats::read_metrics(a + "/metrics.jsonl");
  const auto mb = vlatune::formats::read_metrics(b + "/metrics.jsonl");
  REQUIRE(ma.size() == mb.size());
  for (size_t i = 0; i < ma.size(); ++i) {
    INFO("step " << ma[i].step);
    CHECK(ma[i].loss == mb[i].loss);
    CHECK(ma[i].grad_norm == mb[i].grad_norm);
  }
}

}  // namespace

TEST_CASE("Sharded optimizer state over 2 Gloo ranks: the unsharded run bit for bit, resumed from its checkpoint",
          "[distributed][gloo][cli][zero]") {
  const std::string dir = vlatune::test::make_temp_dir("zero2");
  std::ofstream(dir + "/shard.json") << R"({"schema": "vlatune.recipe/1", "batch": {"micro_batch": 2},
    "distributed": {"shard_optimizer_state": true}})";
  launch_train(2, dir + "/whole.log",
               std::string(kTrainArgs) + " --steps 4 --checkpoint-every 0 --out " + dir + "/whole");
  // Sharded: two steps, then a resume from the step-2 checkpoint (its optimizer state gathered to rank 0).
  const std::string log =
      launch_train(2, dir + "/sharded.log",
                   std::string(kTrainArgs) + " --steps 2 --recipe " + dir + "/shard.json --out " + dir + "/sharded");
  CHECK_THAT(log, Catch::Contains("sharded over 2 ranks, gradients all-reduced"));
  CHECK_THAT(vlatune::test::read_text(dir + "/sharded/recipe.json"),
             Catch::Contains("\"shard_optimizer_state\": true"));
  const std::string resumed =
      launch_train(2, dir + "/resumed.log", "--resume " + dir + "/sharded --steps 4 --no-progress");
  CHECK_THAT(resumed, Catch::Contains("resumed") && Catch::Contains("parameters identical on all 2 ranks"));
  require_same_weights(dir + "/sharded", dir + "/whole");
  require_same_metrics(dir + "/sharded", dir + "/whole");
}

TEST_CASE("Sharded 8-bit optimizer state over 3 Gloo ranks: the unsharded run bit for bit",
          "[distributed][gloo][cli][zero]") {
  const std::string dir = vlatune::test::make_temp_dir("zero3");
  std::ofstream(dir + "/whole.json") << R"({"schema": "vlatune.recipe/1", "batch": {"micro_batch": 2},
    "optimizer": {"state_dtype": "int8-blockwise"}})";
  std::ofstream(dir + "/shard.json") << R"({"schema": "vlatune.recipe/1", "batch": {"micro_batch": 2},
    "optimizer": {"state_dtype": "int8-blockwise"}, "distributed": {"world_size": 3, "shard_optimizer_state": true}})";
  launch_train(3, dir + "/whole.log",
               std::string(kTrainArgs) + " --steps 3 --checkpoint-every 0 --recipe " + dir + "/whole.json --out " +
                   dir + "/whole");
  const std::string log = launch_train(3, dir + "/sharded.log",
                                       std::string(kTrainArgs) + " --steps 3 --checkpoint-every 0 --recipe " + dir +
                                           "/shard.json --out " + dir + "/sharded");
  CHECK_THAT(log, Catch::Contains("optimizer state: int8-blockwise") && Catch::Contains("sharded over 3 ranks"));
  require_same_weights(dir + "/sharded", dir + "/whole");
  require_same_metrics(dir + "/sharded", dir + "/whole");
}

#endif  // VLATUNE_HAVE_GLOO
