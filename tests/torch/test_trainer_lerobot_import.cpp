// trainer/lerobot_import (+ lerobot_dataset, parquet_table, media_decode, image_resize): LeRobot datasets written
// by tests/lerobot_fixture (every version and storage) import sample for sample as openpi builds them; bad input
// is refused naming the file, episode and frame, and leaves no output behind.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "cli_test_util.h"
#include "data_test_util.h"
#include "trainer/dataset.h"
#include "trainer/file_util.h"
#include "trainer/image_resize.h"
#include "trainer/lerobot_dataset.h"
#include "trainer/lerobot_import.h"
#include "trainer/norm_stats.h"
#include "trainer/tokenizer.h"

#if defined(VLATUNE_HAVE_LEROBOT_FIXTURE)
#include "tests/lerobot_fixture/lerobot_fixture.h"
#endif

using Catch::Matchers::Contains;
using vlatune::test::TempTree;
using namespace vlatune::trainer;

TEST_CASE("episode selections parse ranges and lists and refuse what is not there", "[data][lerobot]") {
  CHECK(parse_episode_selection("0:", 4, "--episodes") == std::vector<int64_t>{0, 1, 2, 3});
  CHECK(parse_episode_selection("1:3", 4, "--episodes") == std::vector<int64_t>{1, 2});
  CHECK(parse_episode_selection(":2,3", 4, "--episodes") == std::vector<int64_t>{0, 1, 3});
  CHECK(parse_episode_selection("3,1,1", 4, "--episodes") == std::vector<int64_t>{1, 3});
  CHECK_THROWS_WITH(parse_episode_selection("4", 4, "--episodes"), Contains("episode 4 does not exist"));
  CHECK_THROWS_WITH(parse_episode_selection("2:2", 4, "--episodes"), Contains("empty"));
  CHECK_THROWS_WITH(parse_episode_selection("1:9", 4, "--episodes"), Contains("past the 4 episodes"));
  CHECK_THROWS_WITH(parse_episode_selection("a", 4, "--val-episodes"), Contains("--val-episodes"));
  CHECK_THROWS_WITH(parse_episode_selection("1,,2", 4, "--episodes"), Contains("empty item"));
  CHECK_THROWS_WITH(parse_episode_selection("-1", 4, "--episodes"), Contains("not an episode number"));
}

TEST_CASE("chunk weights count each frame once per chunk it appears in", "[data][lerobot]") {
  // T = 4, H = 3: chunks [0 1 2] [1 2 3] [2 3 3] [3 3 3].
  CHECK(chunk_weights(4, 3) == std::vector<int64_t>{1, 2, 3, 6});
  CHECK(chunk_weights(1, 5) == std::vector<int64_t>{5});
  for (int64_t t : {1, 7, 50})
    for (int64_t h : {1, 10, 50}) {
      int64_t sum = 0;
      for (int64_t w : chunk_weights(t, h)) sum += w;
      CHECK(sum == t * h);
    }
}

TEST_CASE("weighted norm stats equal the statistics of the rows repeated by their weights", "[data][lerobot]") {
  const std::vector<float> values = {0.5f, -1.f, 2.f, 3.f, -4.f, 0.25f, 9.f, 1.f, 0.f, 7.f};  // [5, 2]
  const std::vector<int64_t> weights = {3, 1, 0, 2, 5};
  std::vector<float> expanded;
  for (size_t r = 0; r < weights.size(); ++r)
    for (int64_t k = 0; k < weights[r]; ++k) expanded.insert(expanded.end(), {values[2 * r], values[2 * r + 1]});
  const auto s = compute_norm_stats(values, 2, weights);
  const auto q = compute_quantiles(expanded, 2);
  CHECK(s.q01 == q.q01);
  CHECK(s.q99 == q.q99);
  for (int d = 0; d < 2; ++d) {
    double sum = 0, sq = 0;
    const auto n = static_cast<double>(expanded.size() / 2);
    for (size_t i = d; i < expanded.size(); i += 2) sum += expanded[i], sq += double(expanded[i]) * expanded[i];
    CHECK(s.mean[d] == Approx(sum / n));
    CHECK(s.std[d] == Approx(std::sqrt(sq / n - (sum / n) * (sum / n))));
  }
  CHECK_THROWS(compute_norm_stats(values, 2, {1, 1}));
  CHECK_THROWS(compute_norm_stats(values, 2, {0, 0, 0, 0, 0}));
}

TEST_CASE("LeRobot path templates expand as Python's format does", "[data][lerobot]") {
  CHECK(format_lerobot_path("data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet",
                            {{"episode_chunk", 1}, {"episode_index", 1042}}, {},
                            "t") == "data/chunk-001/episode_001042.parquet");
  CHECK(format_lerobot_path("videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4",
                            {{"chunk_index", 0}, {"file_index", 12}}, {{"video_key", "observation.images.image"}},
                            "t") == "videos/observation.images.image/chunk-000/file-012.mp4");
  CHECK_THROWS_WITH(format_lerobot_path("a/{nope}.x", {}, {}, "info.json: $.data_path"),
                    Contains("info.json: $.data_path") && Contains("unknown field {nope}"));
  CHECK_THROWS_WITH(format_lerobot_path("a/{episode_index", {{"episode_index", 1}}, {}, "t"), Contains("unmatched"));
  CHECK_THROWS_WITH(format_lerobot_path("a/{episode_index:x}", {{"episode_index", 1}}, {}, "t"),
                    Contains("unsupported format spec"));
}

TEST_CASE("resize_with_pad keeps same-size images, fits others and centres them on black", "[data][lerobot]") {
  std::vector<uint8_t> img(4 * 4 * 3);
  for (size_t i = 0; i < img.size(); ++i) img[i] = static_cast<uint8_t>(i * 7);
  std::vector<uint8_t> out(4 * 4 * 3, 1);
  resize_with_pad(img.data(), 4, 4, 4, out.data());
  CHECK(out == img);
  // A constant 2x4 (h x w) image into 4x4: resized to 2x4 (no change of width), pasted at row 1 of zeros.
  std::vector<uint8_t> flat(2 * 4 * 3, 200), boxed(4 * 4 * 3, 1);
  resize_with_pad(flat.data(), 2, 4, 4, boxed.data());
  for (int y = 0; y < 4; ++y)
    for (int x = 0; x < 4; ++x)
      for (int c = 0; c < 3; ++c) CHECK(boxed[(y * 4 + x) * 3 + c] == ((y == 1 || y == 2) ? 200 : 0));
  // Downscaling 2x2 -> 1x1 averages, as PIL does: each row first, rounded to 8 bits, then the column. The last
  // channel shows the intermediate rounding: rows (30+60)/2 = 45 and (90+121)/2 = 105.5 -> 106, then
  // (45+106)/2 = 75.5 -> 76 (a float average of all four would give 75).
  const std::vector<uint8_t> quad = {10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 121};
  const auto one = resize_bilinear_pil(quad.data(), 2, 2, 1, 1);
  CHECK(one == std::vector<uint8_t>{55, 65, 76});
  CHECK_THROWS(resize_bilinear_pil(quad.data(), 2, 2, 0, 1));
}

#if defined(VLATUNE_HAVE_LEROBOT_FIXTURE) && defined(VLATUNE_HAVE_SENTENCEPIECE)

using vlatune::test::train_tiny_tokenizer;
using vlatune::testing::LeRobotFixture;

namespace {

float normalized(float raw, float q01, float q99) {
  return static_cast<float>((raw - double(q01)) / (double(q99) - q01 + 1e-6) * 2.0 - 1.0);
}

struct Imported {
  LeRobotImportReport report;
  std::shared_ptr<const Dataset> train;
};

Imported import(const LeRobotFixture& f, const std::string& tokenizer, const std::string& out,
                LeRobotImportOptions o = {}) {
  o.sources = {f.dir};
  o.tokenizer_model = tokenizer;
  o.out = out;
  o.image_side = o.image_side == 224 ? f.width : o.image_side;
  o.workers = 2;
  o.horizon = o.horizon == 50 ? 4 : o.horizon;
  Imported r;
  r.report = import_lerobot(o);
  r.train = Dataset::open(out);
  return r;
}

// Checks every sample of the imported episodes [first, first + count) of the fixture against its known values:
// prompt, state, action chunk (clamped at the episode end), and images (exact, or within `max_mean_error` levels
// per frame and closer to its own frame than to its neighbours).
void check_samples(const LeRobotFixture& f, const Dataset& ds, const std::vector<int64_t>& episodes,
                   const PromptTokenizer& tok, double max_mean_error) {
  const auto& m = ds.manifest();
  const auto& l = m.layout;
  int64_t i = 0;
  for (int64_t e : episodes) {
    const int64_t T = f.episode_lengths[static_cast<size_t>(e)];
    const auto prompt = tok.tokenize(vlatune::testing::fixture_task(f, e));
    for (int64_t t = 0; t < T; ++t, ++i) {
      INFO("episode " << e << " frame " << t << " sample " << i);
      REQUIRE(i < ds.size());
      CHECK(ds.token_len(i) == prompt.length);
      CHECK(std::vector<int32_t>(ds.tokens(i), ds.tokens(i) + l.text_len) == prompt.ids);
      for (int64_t d = 0; d < l.state_dim; ++d)
        CHECK(ds.state(i)[d] ==
              Approx(normalized(vlatune::testing::fixture_state(f, e, t, d), m.norm.state.q01[d], m.norm.state.q99[d]))
                  .margin(1e-5));
      for (int64_t k = 0; k < l.horizon; ++k)
        for (int64_t d = 0; d < l.action_dim; ++d) {
          const float raw = vlatune::testing::fixture_action(f, e, std::min(t + k, T - 1), d);
          CHECK(ds.actions(i)[k * l.action_dim + d] ==
                Approx(normalized(raw, m.norm.actions.q01[d], m.norm.actions.q99[d])).margin(1e-5));
        }
      for (int64_t c = 0; c < l.cameras; ++c) {
        const uint8_t* got = ds.image(i, c);
        auto error_to = [&](int64_t frame) {
          const auto want = vlatune::testing::fixture_frame(f, c, e, frame);
          double sum = 0;
          for (size_t p = 0; p < want.size(); ++p) sum += std::abs(int(got[p]) - int(want[p]));
          return sum / static_cast<double>(want.size());
        };
        const double own = error_to(t);
        if (max_mean_error == 0) {
          CHECK(own == 0);
        } else {
          CHECK(own <= max_mean_error);
          if (t > 0) CHECK(own < error_to(t - 1));
          if (t + 1 < T) CHECK(own < error_to(t + 1));
        }
      }
    }
  }
  CHECK(i == ds.size());
}

// The statistics the import must produce, computed directly from the fixture's values over `episodes`.
void check_norm_stats(const LeRobotFixture& f, const NormStats& got, const std::vector<int64_t>& episodes,
                      int64_t horizon) {
  std::vector<float> states, chunked;
  for (int64_t e : episodes) {
    const int64_t T = f.episode_lengths[static_cast<size_t>(e)];
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t d = 0; d < f.state_dim; ++d) states.push_back(vlatune::testing::fixture_state(f, e, t, d));
      for (int64_t k = 0; k < horizon; ++k)
        for (int64_t d = 0; d < f.action_dim; ++d)
          chunked.push_back(vlatune::testing::fixture_action(f, e, std::min(t + k, T - 1), d));
    }
  }
  const auto qs = compute_quantiles(states, f.state_dim), qa = compute_quantiles(chunked, f.action_dim);
  CHECK(got.state.q01 == qs.q01);
  CHECK(got.state.q99 == qs.q99);
  CHECK(got.actions.q01 == qa.q01);
  CHECK(got.actions.q99 == qa.q99);
  REQUIRE(got.actions.mean.size() == static_cast<size_t>(f.action_dim));
  for (int64_t d = 0; d < f.action_dim; ++d) {
    double sum = 0, sq = 0;
    const auto n = static_cast<double>(chunked.size() / f.action_dim);
    for (size_t p = d; p < chunked.size(); p += f.action_dim) sum += chunked[p], sq += double(chunked[p]) * chunked[p];
    CHECK(got.actions.mean[d] == Approx(sum / n).margin(1e-6));
    CHECK(got.actions.std[d] == Approx(std::sqrt(std::max(0.0, sq / n - (sum / n) * (sum / n)))).margin(1e-5));
  }
}

std::vector<int64_t> all_episodes(const LeRobotFixture& f) {
  std::vector<int64_t> e;
  for (size_t i = 0; i < f.episode_lengths.size(); ++i) e.push_back(static_cast<int64_t>(i));
  return e;
}

// Rewrites meta/info.json through `edit` (key order kept).
template <typename Edit>
void edit_info(const LeRobotFixture& f, Edit edit) {
  const std::string path = f.dir + "/meta/info.json";
  auto j = nlohmann::ordered_json::parse(vlatune::test::read_file_bytes(path));
  edit(j);
  vlatune::test::write_file_bytes(path, j.dump(2));
}

}  // namespace

TEST_CASE("a LeRobot v2.1 dataset with PNG frames imports pixel-exact, with openpi's chunks, prompts and stats",
          "[data][lerobot]") {
  TempTree tmp;
  const auto model = train_tiny_tokenizer(tmp);
  const PromptTokenizer tok(model);
  for (const char* layout : {"fixed", "list"}) {
    LeRobotFixture f;
    f.dir = tmp / (std::string("v21_") + layout);
    f.version = "v2.1";
    f.vector_layout = layout;
    f.episode_lengths = {6, 3, 5};
    vlatune::testing::write_lerobot_fixture(f);
    const auto r = import(f, model, tmp / (std::string("out_") + layout));
    CHECK(r.report.version == "v2.1");
    CHECK(r.report.camera_keys == std::vector<std::string>{"image", "wrist_image"});
    CHECK(r.report.state_key == "state");
    CHECK(r.report.action_key == "actions");
    CHECK(r.train->manifest().cameras == std::vector<std::string>{"base_0_rgb", "left_wrist_0_rgb"});
    CHECK(r.train->manifest().layout.horizon == 4);
    check_samples(f, *r.train, all_episodes(f), tok, 0);
    check_norm_stats(f, r.train->manifest().norm, all_episodes(f), 4);
    CHECK(vlatune::trainer::path_exists(tmp / (std::string("out_") + layout) + "/norm_stats.json"));
  }
  // --discrete-state: each frame's prompt carries its own normalized state (spec §4.6).
  LeRobotFixture f;
  f.dir = tmp / "discrete";
  f.episode_lengths = {4, 3};
  vlatune::testing::write_lerobot_fixture(f);
  LeRobotImportOptions o;
  o.discrete_state = true;
  const auto r = import(f, model, tmp / "out_discrete", o);
  CHECK(r.train->manifest().tokenizer.discrete_state);
  for (int64_t i = 0; i < r.train->size(); ++i) {
    const int64_t e = i < 4 ? 0 : 1;
    const auto p = tok.tokenize(vlatune::testing::fixture_task(f, e), r.train->state(i), f.state_dim);
    CHECK(std::vector<int32_t>(r.train->tokens(i), r.train->tokens(i) + 200) == p.ids);
  }
}

TEST_CASE("JPEG frames in the parquet import within a few levels, each nearest its own frame", "[data][lerobot]") {
  TempTree tmp;
  const auto model = train_tiny_tokenizer(tmp);
  const PromptTokenizer tok(model);
  for (const char* version : {"v2.1", "v3.0"}) {
    INFO(version);
    LeRobotFixture f;
    f.dir = tmp / (std::string("jpeg_") + version);
    f.version = version;
    f.image_format = "jpeg";
    f.episode_lengths = {5, 4};
    vlatune::testing::write_lerobot_fixture(f);
    const auto r = import(f, model, tmp / (std::string("out_jpeg_") + version));
    // Lossy (quantized DCT, 4:2:0 chroma): a few levels per pixel on these smooth frames, as for video.
    check_samples(f, *r.train, all_episodes(f), tok, 6.0);
    check_norm_stats(f, r.train->manifest().norm, all_episodes(f), 4);
  }
}

TEST_CASE("v2.0 and v3.0 datasets import the same samples; v3.0 reads many episodes per file", "[data][lerobot]") {
  TempTree tmp;
  const auto model = train_tiny_tokenizer(tmp);
  const PromptTokenizer tok(model);
  for (const char* version : {"v2.0", "v3.0"}) {
    LeRobotFixture f;
    f.dir = tmp / version;
    f.version = version;
    f.episode_lengths = {4, 7, 2, 5, 3};
    f.episodes_per_file = 2;
    vlatune::testing::write_lerobot_fixture(f);
    const auto r = import(f, model, tmp / (std::string("out_") + version));
    CHECK(r.report.version == version);
    check_samples(f, *r.train, all_episodes(f), tok, 0);
    check_norm_stats(f, r.train->manifest().norm, all_episodes(f), 4);
  }
}

TEST_CASE("video frames (AV1 and H.264) are matched by timestamp, across episodes sharing a file", "[data][lerobot]") {
  TempTree tmp;
  const auto model = train_tiny_tokenizer(tmp);
  const PromptTokenizer tok(model);
  struct Case {
    const char* version;
    const char* codec;
  };
  for (const Case c : {Case{"v3.0", "libsvtav1"}, Case{"v2.1", "libx264"}, Case{"v3.0", "libx264"}}) {
    INFO(c.version << " " << c.codec);
    LeRobotFixture f;
    f.dir = tmp / (std::string(c.version) + c.codec);
    f.version = c.version;
    f.storage = "video";
    f.codec = c.codec;
    f.width = f.height = 64;
    f.episode_lengths = {6, 4, 5};
    f.episodes_per_file = 2;
    vlatune::testing::write_lerobot_fixture(f);
    const auto r = import(f, model, tmp / (std::string("out_") + c.version + c.codec));
    // Lossy video: a few levels of error per pixel on these smooth frames, and always nearest its own frame.
    check_samples(f, *r.train, all_episodes(f), tok, 6.0);
  }
}

TEST_CASE("episode selection, a validation split and several sources", "[data][lerobot]") {
  TempTree tmp;
  const auto model = train_tiny_tokenizer(tmp);
  const PromptTokenizer tok(model);
  LeRobotFixture a, b;
  a.dir = tmp / "a";
  a.episode_lengths = {3, 4, 5, 2};
  b.dir = tmp / "b";
  b.version = "v3.0";
  b.seed = 7;
  b.episode_lengths = {6, 3};
  vlatune::testing::write_lerobot_fixture(a);
  vlatune::testing::write_lerobot_fixture(b);

  LeRobotImportOptions o;
  o.sources = {a.dir, b.dir};
  o.tokenizer_model = model;
  o.out = tmp / "out";
  o.image_side = a.width;
  o.horizon = 3;
  o.episodes = "1:";  // a's 1, 2, 3 and b's 0, 1 (global 4, 5)
  o.val_episodes = "2";
  const auto r = import_lerobot(o);
  CHECK(r.episodes == 3);
  CHECK(r.val_episodes == 2);
  CHECK(r.frames == 4 + 5 + 2);
  CHECK(r.val_frames == 6 + 3);
  const auto train = Dataset::open(tmp / "out");
  const auto val = Dataset::open(tmp / "out/val");
  check_samples(a, *train, {1, 2, 3}, tok, 0);
  check_samples(b, *val, {0, 1}, tok, 0);
  // Statistics come from the training episodes only, and the held-out ones are normalized with them.
  check_norm_stats(a, train->manifest().norm, {1, 2, 3}, 3);
  CHECK(val->manifest().norm.actions.q01 == train->manifest().norm.actions.q01);

  o.out = tmp / "out2";
  o.episodes = "0,2";
  o.val_episodes = "1:2";  // indices; a bare number is a count
  CHECK_THROWS_WITH(import_lerobot(o), Contains("is not among --episodes"));
  o.val_episodes = "2";
  CHECK_THROWS_WITH(import_lerobot(o), Contains("some must stay for training"));
  CHECK_FALSE(vlatune::trainer::path_exists(tmp / "out2"));

  // Sources with different features are refused.
  LeRobotFixture c;
  c.dir = tmp / "c";
  c.state_dim = 6;
  vlatune::testing::write_lerobot_fixture(c);
  o.sources = {a.dir, c.dir};
  o.episodes.clear();
  o.val_episodes.clear();
  CHECK_THROWS_WITH(import_lerobot(o), Contains(c.dir) && Contains("feature state"));
}

TEST_CASE("bad LeRobot input is refused naming the file, episode and frame, and leaves no output", "[data][lerobot]") {
  TempTree tmp;
  const auto model = train_tiny_tokenizer(tmp);
  int n = 0;
  auto fresh = [&](const std::string& version, const std::string& storage) {
    LeRobotFixture f;
    f.dir = tmp / ("d" + std::to_string(++n));
    f.version = version;
    f.storage = storage;
    f.codec = "libx264";
    f.episode_lengths = {5, 3};
    vlatune::testing::write_lerobot_fixture(f);
    return f;
  };
  auto refused = [&](const LeRobotFixture& f, LeRobotImportOptions o = {}) -> std::string {
    const std::string out = tmp / ("out" + std::to_string(++n));
    o.sources = {f.dir};
    o.tokenizer_model = model;
    o.out = out;
    o.image_side = f.width;
    o.horizon = 4;
    o.workers = 2;
    std::string message;
    try {
      import_lerobot(o);
    } catch (const std::exception& e) {
      message = e.what();
    }
    CHECK_FALSE(message.empty());
    CHECK_FALSE(vlatune::trainer::path_exists(out));
    CHECK_FALSE(vlatune::trainer::path_exists(out + ".partial-import"));
    return message;
  };

  SECTION("no info.json, or a version it does not read") {
    auto f = fresh("v2.1", "image");
    edit_info(f, [](auto& j) { j["codebase_version"] = "v1.6"; });
    CHECK_THAT(refused(f), Contains("meta/info.json") && Contains("\"v1.6\" is not a version"));
    ::unlink((f.dir + "/meta/info.json").c_str());
    CHECK_THAT(refused(f), Contains("meta/info.json: missing"));
  }
  SECTION("a missing or truncated parquet file") {
    auto f = fresh("v2.1", "image");
    const auto file = vlatune::testing::fixture_data_file(f, 1);
    const auto bytes = vlatune::test::read_file_bytes(file);
    vlatune::test::write_file_bytes(file, bytes.substr(0, bytes.size() / 2));
    CHECK_THAT(refused(f), Contains(file) && Contains("parquet"));
    ::unlink(file.c_str());
    CHECK_THAT(refused(f), Contains(file) && Contains("missing"));
  }
  SECTION("a column of the wrong type or shape") {
    auto f = fresh("v3.0", "image");
    edit_info(f, [](auto& j) { j["features"]["state"]["shape"] = {9}; });
    CHECK_THAT(refused(f), Contains("column 'state'") && Contains("has 8 values") && Contains("says 9"));
    auto g = fresh("v2.1", "image");
    LeRobotImportOptions o;
    o.state_key = "frame_index";
    CHECK_THAT(refused(g, o), Contains("frame_index is int64, expected float32"));
    o.state_key = "nope";
    CHECK_THAT(refused(g, o), Contains("--state nope: no such feature") && Contains("image (image)"));
    LeRobotImportOptions cams;
    cams.cameras = {"wrist_image", "state"};
    CHECK_THAT(refused(g, cams), Contains("--camera state: not an image/video feature"));
  }
  SECTION("fps that disagree") {
    auto f = fresh("v2.1", "image");
    edit_info(f, [](auto& j) { j["fps"] = 20; });
    CHECK_THAT(refused(f), Contains("episode 0, frame 1") && Contains("fps"));
    auto v = fresh("v2.1", "video");
    edit_info(v, [](auto& j) { j["features"]["image"]["info"]["video.fps"] = 12; });
    CHECK_THAT(refused(v), Contains("fps that disagree"));
  }
  SECTION("a corrupt PNG names the column, episode and frame") {
    LeRobotFixture f;
    f.dir = tmp / "corrupt_png";
    f.episode_lengths = {5, 3};
    f.corrupt_image_episode = 1;
    f.corrupt_image_frame = 2;
    vlatune::testing::write_lerobot_fixture(f);
    const auto message = refused(f);
    CHECK_THAT(message, Contains(vlatune::testing::fixture_data_file(f, 1)) && Contains("column 'image'") &&
                            Contains("episode 1, frame 2") && Contains("corrupt image"));
  }
  SECTION("a missing video, or a timestamp past a video's end") {
    auto f = fresh("v2.1", "video");
    const auto v0 = vlatune::testing::fixture_video_file(f, 0, 0), v1 = vlatune::testing::fixture_video_file(f, 0, 1);
    // Episode 0 has 5 frames; give it episode 1's 3-frame video: frames 3 and 4 are past its end.
    vlatune::test::write_file_bytes(v0, vlatune::test::read_file_bytes(v1));
    CHECK_THAT(refused(f), Contains(v0) && Contains("episode 0, frame 3") && Contains("the stream ends"));
    ::unlink(v0.c_str());
    CHECK_THAT(refused(f), Contains(v0) && Contains("missing"));
  }
  SECTION("an earlier import's leftovers are removed and the rerun starts clean") {
    auto f = fresh("v2.1", "image");
    const std::string out = tmp / "clean";
    vlatune::trainer::make_directories(out + ".partial-import/junk");
    LeRobotImportOptions o;
    o.sources = {f.dir};
    o.tokenizer_model = model;
    o.out = out;
    o.image_side = f.width;
    o.horizon = 2;
    import_lerobot(o);
    CHECK(Dataset::open(out)->size() == 8);
    CHECK_FALSE(vlatune::trainer::path_exists(out + ".partial-import"));
    CHECK_THROWS_WITH(import_lerobot(o), Contains("not an empty directory"));
  }
}

TEST_CASE("vlatune data import --lerobot, then vlatune train on the imported tiny-size data", "[data][lerobot][cli]") {
  TempTree tmp;
  const auto model = train_tiny_tokenizer(tmp);
  LeRobotFixture f;
  f.dir = tmp / "libero";
  f.version = "v3.0";
  f.cameras = {"observation.images.image", "observation.images.image2"};
  f.state_key = "observation.state";
  f.action_key = "action";
  f.width = f.height = 40;  // resized to the tiny config's 28 with openpi's resize_with_pad
  f.episode_lengths = {6, 5, 7};
  vlatune::testing::write_lerobot_fixture(f);
  const std::string data = tmp / "data";
  auto r = vlatune::test::run_cli({"data", "import", "--lerobot", f.dir, "--tokenizer", model, "--out", data,
                                   "--image-side", "28", "--horizon", "4", "--val-episodes", "1"});
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out, Contains("observation.images.image -> base_0_rgb") && Contains("observation.state") &&
                        Contains("frames/s"));
  const auto ds = Dataset::open(data);
  CHECK(ds->size() == 11);
  CHECK(ds->layout().image_side == 28);
  CHECK(Dataset::open(data + "/val")->size() == 7);
  // The stored images are resize_with_pad of the fixture's frames.
  std::vector<uint8_t> want(28 * 28 * 3);
  const auto frame = vlatune::testing::fixture_frame(f, 1, 0, 2);
  resize_with_pad(frame.data(), 40, 40, 28, want.data());
  CHECK(std::vector<uint8_t>(ds->image(2, 1), ds->image(2, 1) + want.size()) == want);

  auto bad = vlatune::test::run_cli({"data", "import", "--lerobot", f.dir, "--tokenizer", model, "--out", tmp / "bad",
                                     "--camera", "observation.images.nope"});
  CHECK(bad.code == vlatune::cli::kExitBadInput);
  CHECK_THAT(bad.err, Contains("observation.images.nope") && Contains("observation.images.image2 (image)"));
  auto nan = vlatune::test::run_cli(
      {"data", "import", "--lerobot", f.dir, "--tokenizer", model, "--out", tmp / "nan", "--tolerance", "nan"});
  CHECK(nan.code == vlatune::cli::kExitBadInput);
  auto both = vlatune::test::run_cli(
      {"data", "import", "--lerobot", f.dir, "--libero", f.dir, "--tokenizer", model, "--out", tmp / "both"});
  CHECK(both.code == vlatune::cli::kExitBadInput);

  auto t =
      vlatune::test::run_cli({"train", "--config", "tiny", "--device", "cpu", "--data", data, "--batch", "2", "--steps",
                              "3", "--timing-warmup", "0", "--workers", "1", "--out", tmp / "run", "--no-progress"});
  INFO(t.out << t.err);
  REQUIRE(t.code == 0);
  CHECK(vlatune::trainer::path_exists(tmp / "run/final/norm_stats.json"));
  const auto stats = vlatune::test::read_file_bytes(tmp / "run/final/norm_stats.json");
  CHECK_THAT(stats, Contains("\"mean\"") && Contains("\"q99\""));
}

#endif  // VLATUNE_HAVE_LEROBOT_FIXTURE && VLATUNE_HAVE_SENTENCEPIECE
