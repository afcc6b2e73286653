// trainer/loader, synthetic source, image preprocessing, `vlatune data synth`: batches are a pure function of
// (seed, step), resume reproduces a straight run, images without augmentation are exactly the stored pixels
// resized and scaled, and the wait for data is reported.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "../core/file_size_limit.h"
#include "cli/cli.h"
#include "data_test_util.h"
#include "formats/json_error.h"
#include "model/config.h"
#include "trainer/data_source.h"
#include "trainer/dataset.h"
#include "trainer/file_util.h"
#include "trainer/image_preprocess.h"
#include "trainer/loader.h"
#include "trainer/rng.h"
#include "trainer/synthetic.h"

using Catch::Matchers::Contains;
using vlatune::model::Pi05Batch;
using vlatune::model::Pi05Config;
using vlatune::test::TempTree;
using namespace vlatune::trainer;

namespace {

std::string make_synth(const TempTree& tmp, const std::string& name, int64_t samples, int64_t horizon = 6) {
  SynthOptions o;
  o.samples = samples;
  o.seed = 11;
  o.min_prompt = 2;
  o.max_prompt = 12;
  o.horizon = horizon;
  o.out = tmp / name;
  write_synthetic_dataset(o);
  return o.out;
}

LoaderOptions small_options() {
  LoaderOptions o;
  o.workers = 2;
  o.prefetch = 2;
  return o;
}

bool same(const Pi05Batch& a, const Pi05Batch& b) {
  return torch::equal(a.images, b.images) && torch::equal(a.image_masks, b.image_masks) &&
         torch::equal(a.tokens, b.tokens) && torch::equal(a.token_masks, b.token_masks) &&
         torch::equal(a.actions, b.actions) && torch::equal(a.noise, b.noise) && torch::equal(a.time, b.time);
}

// A dataset with hand-made records at `side` px, for checking the preprocessing against its definition.
std::shared_ptr<const Dataset> make_known(const TempTree& tmp, int64_t side, int64_t samples) {
  DatasetManifest m;
  m.layout = RecordLayout{2, side, 200, 5, 7, 8};
  m.cameras = {"base_0_rgb", "left_wrist_0_rgb"};
  m.tokenizer.vocab_size = 512;
  m.norm.actions = {std::vector<float>(7, -1.0f), std::vector<float>(7, 1.0f), {}, {}};
  m.norm.state = {std::vector<float>(8, -1.0f), std::vector<float>(8, 1.0f), {}, {}};
  const auto& l = m.layout;
  DatasetWriter w(tmp / "known", m, samples);
  std::vector<uint8_t> img0(l.image_bytes()), img1(l.image_bytes());
  std::vector<int32_t> tokens(200, 0);
  std::vector<float> actions(5 * 7), state(8, 0.0f);
  for (int64_t i = 0; i < samples; ++i) {
    SplitMix64 rng(7 + i);
    rng.fill_bytes(img0.data(), l.image_bytes());
    rng.fill_bytes(img1.data(), l.image_bytes());
    for (int t = 0; t < 3 + i; ++t) tokens[t] = static_cast<int32_t>(10 * i + t + 1);
    for (size_t k = 0; k < actions.size(); ++k) actions[k] = static_cast<float>(i) + 0.01f * static_cast<float>(k);
    SampleView v;
    v.images = {img0.data(), img1.data()};
    v.tokens = tokens.data();
    v.token_len = static_cast<int32_t>(3 + i);
    v.actions = actions.data();
    v.state = state.data();
    w.append(v);
  }
  w.finish();
  return Dataset::open(tmp / "known");
}

// Stored image of (sample, camera) as [3, side, side] float in [0, 1].
torch::Tensor stored01(const Dataset& ds, int64_t index, int64_t camera) {
  const int64_t side = ds.layout().image_side;
  auto hwc = torch::from_blob(const_cast<uint8_t*>(ds.image(index, camera)), {side, side, 3}, torch::kByte);
  return hwc.permute({2, 0, 1}).to(torch::kFloat32) / 255.0;
}

}  // namespace

TEST_CASE("the loader gives identical batches for a seed and different ones for other steps or seeds", "[data]") {
  TempTree tmp;
  const auto dir = make_synth(tmp, "ds", 10);
  const auto cfg = Pi05Config::tiny();
  auto a = open_data_source(dir, cfg, 4, 3, torch::kCPU, small_options());
  auto b = open_data_source(dir, cfg, 4, 3, torch::kCPU, small_options());
  auto c = open_data_source(dir, cfg, 4, 4, torch::kCPU, small_options());
  std::vector<Pi05Batch> batches;
  for (int64_t step = 0; step < 4; ++step) {
    batches.push_back(a->next(step, nullptr));
    CHECK(same(batches.back(), b->next(step, nullptr)));
  }
  CHECK_FALSE(same(batches[0], batches[1]));
  CHECK_FALSE(torch::equal(batches[0].noise, batches[1].noise));
  CHECK_FALSE(same(batches[0], c->next(0, nullptr)));
  CHECK(a->position().next_step == 4);
  CHECK(a->position().seed == 3);
  CHECK(a->position().fingerprint.rfind("xxh64:", 0) == 0);

  const Pi05Batch& x = batches[0];
  CHECK(x.images.sizes() == torch::IntArrayRef{4, 3, 3, 28, 28});
  CHECK(x.images.scalar_type() == torch::kFloat32);
  CHECK(x.image_masks.sizes() == torch::IntArrayRef{4, 3});
  CHECK(x.tokens.sizes() == torch::IntArrayRef{4, 200});
  CHECK(x.tokens.scalar_type() == torch::kLong);
  CHECK(x.actions.sizes() == torch::IntArrayRef{4, 6, 32});
  CHECK(x.noise.sizes() == torch::IntArrayRef{4, 6, 32});
  CHECK(x.time.sizes() == torch::IntArrayRef{4});
  CHECK(x.time.min().item<float>() >= 0.001f);
  CHECK(x.time.max().item<float>() <= 1.0f);
  CHECK(x.actions.narrow(2, 7, 25).abs().max().item<float>() == 0.0f);  // zero-padded to 32
  // The host summary of the masks (what the shortcuts read instead of the masks) says what the masks say.
  for (const Pi05Batch& batch : batches) {
    REQUIRE(batch.used_slots);
    const torch::Tensor any = batch.image_masks.any(0);
    for (int64_t s = 0; s < any.size(0); ++s) CHECK((*batch.used_slots)[static_cast<size_t>(s)] == any[s].item<bool>());
    REQUIRE(batch.text_used);
    CHECK(*batch.text_used == batch.token_masks.sum(1).max().item<int64_t>());
    REQUIRE(batch.valid_images);
    CHECK(*batch.valid_images == batch.image_masks.sum().item<int64_t>());
    REQUIRE(batch.valid_tokens);
    CHECK(*batch.valid_tokens == batch.token_masks.sum().item<int64_t>());
  }
}

TEST_CASE("a loader resumed at step k gives the batches a straight run gives", "[data]") {
  TempTree tmp;
  const auto dir = make_synth(tmp, "ds", 7);
  const auto cfg = Pi05Config::tiny();
  auto opts = small_options();
  opts.augment = true;  // augmentation must be reproducible too
  auto straight = open_data_source(dir, cfg, 3, 9, torch::kCPU, opts);
  std::vector<Pi05Batch> expected;
  for (int64_t step = 0; step < 6; ++step) expected.push_back(straight->next(step, nullptr));

  auto resumed = open_data_source(dir, cfg, 3, 9, torch::kCPU, opts);
  for (int64_t step = 3; step < 6; ++step) CHECK(same(resumed->next(step, nullptr), expected[step]));
  // Jumping back within one loader restarts its prefetch and still gives the same batch.
  CHECK(same(resumed->next(1, nullptr), expected[1]));
  CHECK(same(resumed->next(2, nullptr), expected[2]));
}

TEST_CASE("every epoch visits every sample once, in an order drawn from the seed", "[data]") {
  TempTree tmp;
  const auto ds = Dataset::open(make_synth(tmp, "ds", 10));
  DatasetLoader loader(ds, Pi05Config::tiny(), 4, 5, torch::kCPU, small_options());
  std::vector<int64_t> order;
  for (int64_t step = 0; step < 5; ++step)
    for (int64_t i = 0; i < 4; ++i) order.push_back(loader.sample_index(step, i));
  const std::set<int64_t> epoch0(order.begin(), order.begin() + 10), epoch1(order.begin() + 10, order.end());
  CHECK(epoch0.size() == 10);
  CHECK(epoch1.size() == 10);
  CHECK(std::vector<int64_t>(order.begin(), order.begin() + 10) !=
        std::vector<int64_t>(order.begin() + 10, order.end()));
}

TEST_CASE("without augmentation the images are the stored pixels resized and scaled to [-1, 1]", "[data]") {
  TempTree tmp;
  const auto cfg = Pi05Config::tiny();  // 28 px

  SECTION("stored at the model's size: x / 255 * 2 - 1 exactly, the empty third slot -1") {
    const auto ds = Dataset::open(make_synth(tmp, "ds", 5));
    DatasetLoader loader(ds, cfg, 2, 1, torch::kCPU, small_options());
    const auto b = loader.next(0, nullptr);
    for (int64_t i = 0; i < 2; ++i) {
      const int64_t idx = loader.sample_index(0, i);
      for (int64_t c = 0; c < 2; ++c) CHECK(torch::equal(b.images[i][c], stored01(*ds, idx, c) * 2.0 - 1.0));
      CHECK(b.images[i][2].eq(-1.0).all().item<bool>());
    }
    CHECK(torch::equal(b.image_masks, torch::tensor({true, true, false}).expand({2, 3})));
  }

  SECTION("stored at another size: bilinear resize (align_corners false), tokens, masks and chunk slicing") {
    const auto ds = make_known(tmp, 14, 4);
    auto opts = small_options();
    opts.horizon = 2;  // the first two steps of each stored 5-step chunk
    DatasetLoader loader(ds, cfg, 3, 2, torch::kCPU, opts);
    const auto b = loader.next(1, nullptr);
    namespace F = torch::nn::functional;
    for (int64_t i = 0; i < 3; ++i) {
      const int64_t idx = loader.sample_index(1, i);
      for (int64_t c = 0; c < 2; ++c) {
        auto ref = F::interpolate(
            stored01(*ds, idx, c).unsqueeze(0),
            F::InterpolateFuncOptions().size(std::vector<int64_t>{28, 28}).mode(torch::kBilinear).align_corners(false));
        CHECK(torch::allclose(b.images[i][c], ref[0] * 2.0 - 1.0, 0.0, 1e-6));
      }
      const int64_t len = 3 + idx;
      CHECK(b.token_masks[i].sum().item<int64_t>() == len);
      CHECK(b.token_masks[i].narrow(0, 0, len).all().item<bool>());
      CHECK(b.tokens[i][0].item<int64_t>() == 10 * idx + 1);
      CHECK(b.tokens[i].narrow(0, len, 200 - len).eq(0).all().item<bool>());
      CHECK(b.actions.sizes() == torch::IntArrayRef{3, 2, 32});
      for (int64_t k = 0; k < 2 * 7; ++k)
        CHECK(b.actions[i][k / 7][k % 7].item<float>() == static_cast<float>(idx) + 0.01f * static_cast<float>(k));
    }
  }
}

TEST_CASE("augmentation is reproducible per step, changes the images and stays in [-1, 1]", "[data]") {
  TempTree tmp;
  const auto dir = make_synth(tmp, "ds", 6);
  const auto cfg = Pi05Config::tiny();
  auto on = small_options();
  on.augment = true;
  auto a = open_data_source(dir, cfg, 2, 5, torch::kCPU, on);
  auto b = open_data_source(dir, cfg, 2, 5, torch::kCPU, on);
  auto plain = open_data_source(dir, cfg, 2, 5, torch::kCPU, small_options());
  const auto x = a->next(0, nullptr), y = b->next(0, nullptr), p = plain->next(0, nullptr);
  CHECK(torch::equal(x.images, y.images));
  CHECK_FALSE(torch::equal(x.images, p.images));
  CHECK(torch::equal(x.tokens, p.tokens));  // only the images change
  CHECK(x.images.min().item<float>() >= -1.0f);
  CHECK(x.images.max().item<float>() <= 1.0f);
  CHECK(x.images.select(1, 2).eq(-1.0).all().item<bool>());  // the empty slot is never augmented
  CHECK_FALSE(torch::equal(a->next(1, nullptr).images, plain->next(1, nullptr).images));

  // Draws: wrist cameras get no crop/rotation, factors within openpi's ranges, one draw per camera.
  const auto draws = draw_augmentation(42, {false, true}, 224);
  REQUIRE(draws.size() == 2);
  CHECK(draws[0].geometric);
  CHECK_FALSE(draws[1].geometric);
  CHECK(draws[0].crop_side == 212);
  CHECK(draws[0].crop_y <= 12);
  CHECK(std::abs(draws[0].angle_deg) <= 5.0);
  CHECK(draws[1].brightness >= 0.7);
  CHECK(draws[1].brightness <= 1.3);
  // Neutral parameters leave an image unchanged.
  auto img = torch::rand({2, 3, 8, 8});
  CHECK(torch::allclose(augment_camera(img, CameraAugment{}), img, 0.0, 1e-6));
}

TEST_CASE("the loader reports per step how long the step waited for data", "[data]") {
  TempTree tmp;
  const auto dir = make_synth(tmp, "ds", 5);
  auto opts = small_options();
  opts.workers = 1;
  opts.prefetch = 1;
  auto src = open_data_source(dir, Pi05Config::tiny(), 2, 1, torch::kCPU, opts);
  for (int64_t step = 0; step < 3; ++step) {
    double wait_ms = -1.0;
    src->next(step, &wait_ms);
    CHECK(std::isfinite(wait_ms));
    CHECK(wait_ms >= 0.0);
  }
  CHECK_THAT(src->describe(), Contains("5 samples") && Contains("1 workers"));
}

TEST_CASE("the synthetic source makes LIBERO-shaped batches on the device, reproducibly", "[data]") {
  const auto cfg = Pi05Config::tiny();
  LoaderOptions o;
  auto a = open_data_source("synthetic", cfg, 8, 2, torch::kCPU, o);
  auto b = open_data_source("synthetic", cfg, 8, 2, torch::kCPU, o);
  double wait_ms = -1.0;
  const auto x = a->next(5, &wait_ms);
  CHECK(wait_ms == 0.0);
  CHECK(same(x, b->next(5, nullptr)));
  CHECK_FALSE(same(x, b->next(6, nullptr)));
  CHECK(x.images.sizes() == torch::IntArrayRef{8, 3, 3, 28, 28});
  CHECK(x.images.select(1, 2).eq(-1.0).all().item<bool>());
  CHECK(torch::equal(x.image_masks, torch::tensor({true, true, false}).expand({8, 3})));
  CHECK(x.used_slots == std::vector<bool>{true, true, false});
  CHECK_FALSE(x.text_used);  // the prompt lengths are drawn on the device
  CHECK_FALSE(x.valid_tokens);
  REQUIRE(x.valid_images);
  CHECK(*x.valid_images == 16);
  const auto lengths = x.token_masks.sum(1);
  CHECK(lengths.min().item<int64_t>() >= 20);
  CHECK(lengths.max().item<int64_t>() <= 199);
  CHECK(torch::equal(x.tokens.gt(0), x.token_masks));
  CHECK(x.tokens.max().item<int64_t>() < 512);
  CHECK(x.actions.sizes() == torch::IntArrayRef{8, 50, 32});
  CHECK(x.actions.narrow(2, 7, 25).abs().max().item<float>() == 0.0f);
  CHECK(x.actions.abs().max().item<float>() <= 1.0f);
  CHECK(x.time.min().item<float>() >= 0.001f);
  CHECK(a->position().next_step == 6);
  CHECK(a->position().fingerprint == "synthetic");
}

TEST_CASE("noise and time depend on (seed, step) only, whatever the data source", "[data]") {
  TempTree tmp;
  const auto dir = make_synth(tmp, "ds", 5, /*horizon=*/50);
  const auto cfg = Pi05Config::tiny();
  auto loader = open_data_source(dir, cfg, 4, 8, torch::kCPU, small_options());
  auto synth = open_data_source("synthetic", cfg, 4, 8, torch::kCPU, LoaderOptions{});
  const auto a = loader->next(2, nullptr), b = synth->next(2, nullptr);
  CHECK(torch::equal(a.noise, b.noise));
  CHECK(torch::equal(a.time, b.time));
}

TEST_CASE("a dataset that does not fit the model or the options is refused before any step", "[data]") {
  TempTree tmp;
  const auto dir = make_synth(tmp, "ds", 3, /*horizon=*/4);
  auto cfg = Pi05Config::tiny();
  cfg.backbone.vocab = 100;  // the dataset's ids go up to 511
  CHECK_THROWS_WITH(open_data_source(dir, cfg, 2, 0, torch::kCPU, small_options()), Contains("vocabulary"));
  auto opts = small_options();
  opts.horizon = 10;
  CHECK_THROWS_WITH(open_data_source(dir, Pi05Config::tiny(), 2, 0, torch::kCPU, opts),
                    Contains("horizon 10") && Contains("chunks of 4"));
  opts = small_options();
  opts.slots = 1;
  CHECK_THROWS_WITH(open_data_source(dir, Pi05Config::tiny(), 2, 0, torch::kCPU, opts), Contains("slots"));
  CHECK_THROWS_AS(open_data_source(tmp / "nothing", Pi05Config::tiny(), 2, 0, torch::kCPU, small_options()),
                  vlatune::formats::FormatError);
}

TEST_CASE("vlatune data synth writes a dataset the loader opens, and rejects bad input", "[data]") {
  TempTree tmp;
  auto run = [](std::vector<std::string> args, std::string* out_text = nullptr) {
    std::vector<const char*> argv{"vlatune"};
    for (const auto& a : args) argv.push_back(a.c_str());
    std::ostringstream out, err;
    const int rc = vlatune::cli::run(static_cast<int>(argv.size()), argv.data(), out, err);
    if (out_text != nullptr) *out_text = out.str() + err.str();
    return rc;
  };
  const std::string dir = tmp / "ds";
  std::string text;
  REQUIRE(
      run({"data", "synth", "--samples", "4", "--seed", "3", "--prompt-len", "5:10", "--horizon", "4", "--out", dir},
          &text) == vlatune::cli::kExitOk);
  CHECK_THAT(text, Contains("4 samples"));
  const auto ds = Dataset::open(dir);
  CHECK(ds->layout().horizon == 4);
  CHECK(ds->manifest().source["prompt_len"] == nlohmann::json({5, 10}));
  CHECK(run({"data", "synth", "--samples", "4", "--out", dir}, &text) == vlatune::cli::kExitBadInput);
  CHECK_THAT(text, Contains("not an empty directory"));
  CHECK(run({"data", "synth", "--samples", "4", "--prompt-len", "5-10", "--out", tmp / "x"}, &text) ==
        vlatune::cli::kExitBadInput);
  CHECK_THAT(text, Contains("MIN:MAX"));
}

TEST_CASE("on the GPU the loader's batches equal the CPU loader's, and full-size loading keeps up", "[.gpu][loader]") {
  REQUIRE(torch::cuda::is_available());
  TempTree tmp;
  const auto dir = make_synth(tmp, "ds", 12);
  const auto tiny = Pi05Config::tiny();
  auto gpu = open_data_source(dir, tiny, 4, 3, torch::kCUDA, small_options());
  auto cpu = open_data_source(dir, tiny, 4, 3, torch::kCPU, small_options());
  std::vector<Pi05Batch> seen;
  for (int64_t step = 0; step < 6; ++step) {
    double wait_ms = -1.0;
    const auto g = gpu->next(step, &wait_ms);
    const auto c = cpu->next(step, nullptr);
    CHECK(wait_ms >= 0.0);
    CHECK(g.images.is_cuda());
    CHECK(g.noise.is_cuda());
    CHECK(torch::allclose(g.images.cpu(), c.images, 0.0, 1e-6));
    CHECK(torch::equal(g.tokens.cpu(), c.tokens));
    CHECK(torch::equal(g.token_masks.cpu(), c.token_masks));
    CHECK(torch::equal(g.actions.cpu(), c.actions));
    CHECK(g.time.min().item<float>() >= 0.001f);
    seen.push_back(g);
  }
  auto resumed = open_data_source(dir, tiny, 4, 3, torch::kCUDA, small_options());
  const auto r = resumed->next(3, nullptr);
  CHECK(torch::equal(r.noise, seen[3].noise));  // the CUDA generator is re-seeded per step too
  CHECK(torch::equal(r.images, seen[3].images));

  auto synth = open_data_source("synthetic", Pi05Config::full(), 32, 0, torch::kCUDA, LoaderOptions{});
  const auto s = synth->next(0, nullptr);
  CHECK(s.images.is_cuda());
  CHECK(s.images.sizes() == torch::IntArrayRef{32, 3, 3, 224, 224});
  CHECK(torch::equal(synth->next(0, nullptr).images, s.images));

  // Full size from disk (stored at 224, augmentation on): steps per second of the loader alone, printed for
  // bench/RESULTS.md; the trainer needs ~1 step/s at batch 32 on an H200, the loader must be far above it.
  SynthOptions o;
  o.config = "full";
  o.samples = 96;
  o.out = tmp / "full";
  write_synthetic_dataset(o);
  auto opts = LoaderOptions{};
  opts.augment = true;
  auto full = open_data_source(o.out, Pi05Config::full(), 32, 0, torch::kCUDA, opts);
  for (int64_t step = 0; step < 3; ++step) full->next(step, nullptr);  // warm-up
  torch::cuda::synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  double wait_total_ms = 0.0;
  const int steps = 20;
  for (int64_t step = 3; step < 3 + steps; ++step) {
    double wait_ms = 0.0;
    full->next(step, &wait_ms);
    wait_total_ms += wait_ms;
  }
  torch::cuda::synchronize();
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  WARN("full-size loader, batch 32, augmentation on: " << ms / steps << " ms/step (" << 32.0 * steps * 1000.0 / ms
                                                       << " samples/s), data wait " << wait_total_ms / steps
                                                       << " ms/step");
  // No timing assertion here (speed belongs in benchmarks): the printed figure goes to bench/RESULTS.md.
}

TEST_CASE("data synth checks the space it needs first, and a full disk exits 1 leaving no partial dataset", "[data]") {
  TempTree tmp;
  auto run = [](std::vector<std::string> args, std::string* text) {
    std::vector<const char*> argv{"vlatune"};
    for (const auto& a : args) argv.push_back(a.c_str());
    std::ostringstream out, err;
    const int rc = vlatune::cli::run(static_cast<int>(argv.size()), argv.data(), out, err);
    *text = out.str() + err.str();
    return rc;
  };
  std::string text;
  // About 7 TB of tiny samples: refused before a byte is written.
  CHECK(run({"data", "synth", "--samples", "1073741824", "--out", tmp / "huge"}, &text) == vlatune::cli::kExitFailure);
  CHECK_THAT(text, Contains(tmp / "huge") && Contains("needs about") && Contains("available"));
  CHECK_FALSE(vlatune::trainer::path_exists(tmp / "huge"));

  // The disk fills up half way (every write past 64 KiB fails, as ENOSPC would): exit 1 naming the shard and the OS
  // error, and nothing left behind (an empty directory the user made stays, empty).
  for (const bool existed : {false, true}) {
    const std::string out = tmp / (existed ? "made" : "fresh");
    if (existed) vlatune::trainer::make_directories(out);
    int rc = 0;
    {
      vlatune::test::FileSizeLimit limit(64 << 10);
      rc = run({"data", "synth", "--samples", "40", "--horizon", "4", "--out", out}, &text);
    }
    CHECK(rc == vlatune::cli::kExitFailure);
    CHECK_THAT(text, Contains(out + "/shard-00000.bin") && Contains("File too large"));
    CHECK(vlatune::trainer::path_exists(out) == existed);
    if (existed) CHECK(vlatune::trainer::is_fresh_output(out));
  }
}
