// trainer/dataset, checksum, norm_stats, synthetic (the on-disk part): packed datasets read back bit-identically,
// synthetic data is a pure function of the seed, and every class of corrupt or mismatched dataset is refused on
// open with the file and the reason.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "data_test_util.h"
#include "formats/json_error.h"
#include "formats/json_io.h"
#include "trainer/checksum.h"
#include "trainer/dataset.h"
#include "trainer/norm_stats.h"
#include "trainer/rng.h"
#include "trainer/synthetic.h"

using Catch::Matchers::Contains;
using vlatune::formats::FormatError;
using vlatune::test::TempTree;
using namespace vlatune::trainer;

namespace {

SynthOptions small_synth(const std::string& out, uint64_t seed) {
  SynthOptions o;
  o.config = "tiny";
  o.samples = 6;
  o.seed = seed;
  o.min_prompt = 3;
  o.max_prompt = 9;
  o.horizon = 4;
  o.out = out;
  o.shard_bytes = 3 * RecordLayout{2, 28, 200, 4, 7, 8}.record_bytes();  // 3 samples per shard: 2 shards
  return o;
}

// The FormatError Dataset::open throws for `dir`, as text (fails the test when it opens).
std::string open_error(const std::string& dir) {
  try {
    Dataset::open(dir);
  } catch (const FormatError& e) {
    return e.what();
  }
  FAIL("Dataset::open accepted a broken dataset");
  return "";
}

void edit_manifest(const std::string& dir, const std::function<void(nlohmann::json&)>& edit) {
  const std::string path = dir + "/manifest.json";
  auto j = vlatune::formats::read_json_file(path);
  edit(j);
  vlatune::test::write_file_bytes(path, vlatune::formats::dump_json_file(j));
}

}  // namespace

TEST_CASE("xxh64 matches the reference values and hashes the same streamed as in one piece", "[data]") {
  CHECK(xxh64("", 0) == 0xEF46DB3751D8E999ULL);
  CHECK(xxh64("abc", 3) == 0x44BC2CF5AD770999ULL);
  CHECK(format_checksum(0xEF46DB3751D8E999ULL) == "xxh64:ef46db3751d8e999");

  std::vector<uint8_t> bytes(1000);
  SplitMix64(1).fill_bytes(bytes.data(), static_cast<int64_t>(bytes.size()));
  const uint64_t whole = xxh64(bytes.data(), bytes.size());
  for (size_t piece : {1, 7, 31, 32, 33, 250}) {
    Xxh64 h;
    for (size_t at = 0; at < bytes.size(); at += piece) h.update(bytes.data() + at, std::min(piece, bytes.size() - at));
    CHECK(h.digest() == whole);
  }
}

TEST_CASE("quantiles interpolate like numpy and normalization passes padded dims through", "[data]") {
  std::vector<float> values;  // two dims: 0..100 and 100..0 (reversed), 101 rows
  for (int i = 0; i <= 100; ++i) values.insert(values.end(), {static_cast<float>(i), static_cast<float>(100 - i)});
  const auto q = compute_quantiles(values, 2);
  CHECK(q.q01 == std::vector<float>{1.0f, 1.0f});
  CHECK(q.q99 == std::vector<float>{99.0f, 99.0f});
  const auto odd = compute_quantiles({0.0f, 10.0f}, 1);  // h = 0.01: 0 + 0.01 * 10
  CHECK(odd.q01[0] == Approx(0.1f));
  CHECK(odd.q99[0] == Approx(9.9f));

  float row[3] = {1.0f, 99.0f, 5.0f};  // the third dim has no statistics: padding, passed through
  normalize_quantile(row, 1, 3, q);
  CHECK(row[0] == -1.0f);
  CHECK(row[1] == Approx(1.0f).margin(1e-7));
  CHECK(row[2] == 5.0f);
  CHECK_THROWS_AS(compute_quantiles({}, 2), std::invalid_argument);
}

TEST_CASE("a dataset written sample by sample reads back bit-identically across shards", "[data]") {
  TempTree tmp;
  DatasetManifest m;
  m.layout = RecordLayout{2, 5, 12, 3, 7, 8};
  m.cameras = {"base_0_rgb", "left_wrist_0_rgb"};
  m.tokenizer.vocab_size = 100;
  m.norm.actions = {std::vector<float>(7, -0.5f), std::vector<float>(7, 0.25f), {}, {}};
  m.norm.state = {std::vector<float>(8, -2.0f), std::vector<float>(8, 3.0f), {}, {}};
  m.source = {{"kind", "test"}};
  const auto& l = m.layout;
  const int64_t n = 7;
  // Each sample's bytes from its own stream, kept for comparison.
  std::vector<std::vector<uint8_t>> images(n * 2, std::vector<uint8_t>(l.image_bytes()));
  std::vector<std::vector<int32_t>> tokens(n, std::vector<int32_t>(l.text_len, 0));
  std::vector<std::vector<float>> actions(n, std::vector<float>(l.horizon * l.action_dim));
  std::vector<std::vector<float>> states(n, std::vector<float>(l.state_dim));
  {
    DatasetWriter writer(tmp / "ds", m, n, 3 * l.record_bytes());  // 3 + 3 + 1 samples
    for (int64_t i = 0; i < n; ++i) {
      SplitMix64 rng(100 + i);
      for (int c = 0; c < 2; ++c) rng.fill_bytes(images[i * 2 + c].data(), l.image_bytes());
      for (int t = 0; t < 1 + i; ++t) tokens[i][t] = static_cast<int32_t>(rng.uniform_int(1, 99));
      for (float& a : actions[i]) a = static_cast<float>(rng.uniform(-1, 1));
      for (float& s : states[i]) s = static_cast<float>(rng.uniform(-1, 1));
      SampleView v;
      v.images = {images[i * 2].data(), images[i * 2 + 1].data()};
      v.tokens = tokens[i].data();
      v.token_len = static_cast<int32_t>(1 + i);
      v.actions = actions[i].data();
      v.state = states[i].data();
      writer.append(v);
    }
    CHECK(writer.finish().shards.size() == 3);
  }
  const auto ds = Dataset::open(tmp / "ds");
  REQUIRE(ds->size() == n);
  CHECK(ds->layout() == l);
  CHECK(ds->manifest().cameras == m.cameras);
  CHECK(ds->manifest().norm.actions.q99 == m.norm.actions.q99);
  CHECK(ds->manifest().norm.state.q01 == m.norm.state.q01);
  CHECK(ds->manifest().source["kind"] == "test");
  for (int64_t i = 0; i < n; ++i) {
    CHECK(ds->token_len(i) == 1 + i);
    CHECK(std::memcmp(ds->tokens(i), tokens[i].data(), 4 * l.text_len) == 0);
    CHECK(std::memcmp(ds->actions(i), actions[i].data(), 4 * actions[i].size()) == 0);
    CHECK(std::memcmp(ds->state(i), states[i].data(), 4 * l.state_dim) == 0);
    for (int c = 0; c < 2; ++c) CHECK(std::memcmp(ds->image(i, c), images[i * 2 + c].data(), l.image_bytes()) == 0);
  }
  CHECK_THROWS_AS(ds->record(n), std::out_of_range);
}

TEST_CASE("synthetic datasets are the same bytes for a seed and differ across seeds", "[data]") {
  TempTree tmp;
  const auto a = write_synthetic_dataset(small_synth(tmp / "a", 5));
  const auto b = write_synthetic_dataset(small_synth(tmp / "b", 5));
  const auto c = write_synthetic_dataset(small_synth(tmp / "c", 6));
  REQUIRE(a.shards.size() == 2);
  for (size_t s = 0; s < a.shards.size(); ++s) {
    CHECK(a.shards[s].checksum == b.shards[s].checksum);
    CHECK(vlatune::test::read_file_bytes(tmp / "a/" + a.shards[s].file) ==
          vlatune::test::read_file_bytes(tmp / "b/" + b.shards[s].file));
    CHECK(a.shards[s].checksum != c.shards[s].checksum);
  }

  const auto ds = Dataset::open(tmp / "a");
  CHECK(ds->layout().image_side == 28);  // tiny config
  CHECK(ds->layout().text_len == 200);
  CHECK(ds->manifest().tokenizer.vocab_size == 512);
  CHECK(ds->manifest().source["seed"] == 5);
  for (int64_t i = 0; i < ds->size(); ++i) {
    const int32_t len = ds->token_len(i);
    CHECK(len >= 3);
    CHECK(len <= 9);
    for (int t = 0; t < 200; ++t) {
      if (t < len) {
        CHECK(ds->tokens(i)[t] >= 1);
        CHECK(ds->tokens(i)[t] < 512);
      } else {
        CHECK(ds->tokens(i)[t] == 0);
      }
    }
    for (int k = 0; k < 4 * 7; ++k) CHECK(std::abs(ds->actions(i)[k]) <= 1.0f);
  }
}

TEST_CASE("a corrupt or mismatched dataset is refused on open with the file and the reason", "[data]") {
  TempTree tmp;
  const std::string dir = tmp / "ds";
  const auto m = write_synthetic_dataset(small_synth(dir, 1));
  const std::string shard1 = dir + "/" + m.shards[1].file;
  const std::string manifest = dir + "/manifest.json";
  REQUIRE_NOTHROW(Dataset::open(dir));

  SECTION("one flipped byte in a record fails the shard's checksum") {
    std::string bytes = vlatune::test::read_file_bytes(shard1);
    bytes[kShardHeaderBytes + 1234] ^= 0x01;
    vlatune::test::write_file_bytes(shard1, bytes);
    const auto msg = open_error(dir);
    CHECK_THAT(msg, Contains(shard1) && Contains("checksum") && Contains("corrupt"));
  }
  SECTION("a truncated shard fails on its size") {
    std::string bytes = vlatune::test::read_file_bytes(shard1);
    vlatune::test::write_file_bytes(shard1, bytes.substr(0, bytes.size() - 100));
    CHECK_THAT(open_error(dir), Contains(shard1) && Contains("truncated"));
  }
  SECTION("a shard of another format version is named as such") {
    vlatune::test::patch_file(shard1, 8, std::string("\x02\x00\x00\x00", 4));
    CHECK_THAT(open_error(dir), Contains(shard1) && Contains("version 2, this build reads version 1"));
  }
  SECTION("a shard whose magic is wrong is not taken for a dataset shard") {
    vlatune::test::patch_file(shard1, 0, "NOTASHRD");
    CHECK_THAT(open_error(dir), Contains(shard1) && Contains("bad magic"));
  }
  SECTION("a manifest whose sample count disagrees with its shards") {
    edit_manifest(dir, [](nlohmann::json& j) { j["samples"] = 7; });
    CHECK_THAT(open_error(dir), Contains(manifest) && Contains("$.samples") && Contains("shards hold 6"));
  }
  SECTION("a manifest and a shard that disagree on the sample count") {
    edit_manifest(dir, [](nlohmann::json& j) {
      j["shards"][0]["samples"] = 2;
      j["shards"][1]["samples"] = 4;
      j["shards"][0]["bytes"] = j["shards"][0]["bytes"].get<int64_t>() - j["record_bytes"].get<int64_t>();
      j["shards"][1]["bytes"] = j["shards"][1]["bytes"].get<int64_t>() + j["record_bytes"].get<int64_t>();
    });
    CHECK_THAT(open_error(dir), Contains(dir + "/" + m.shards[0].file) && Contains("size is"));
  }
  SECTION("a missing shard file") {
    REQUIRE(::unlink(shard1.c_str()) == 0);
    CHECK_THAT(open_error(dir), Contains(shard1) && Contains("missing shard file"));
  }
  SECTION("a manifest of another schema or with an unknown key") {
    edit_manifest(dir, [](nlohmann::json& j) { j["schema"] = "vlatune.dataset/2"; });
    CHECK_THAT(open_error(dir), Contains("$.schema") && Contains("vlatune.dataset/1"));
    edit_manifest(dir, [](nlohmann::json& j) {
      j["schema"] = "vlatune.dataset/1";
      j["horizn"] = 3;
    });
    CHECK_THAT(open_error(dir), Contains("$.horizn") && Contains("unknown key"));
  }
  SECTION("a layout changed in the manifest is caught by the record size or by the shard header") {
    edit_manifest(dir, [](nlohmann::json& j) { j["horizon"] = 5; });  // same 64-byte-rounded record size
    CHECK_THAT(open_error(dir),
               Contains(dir + "/" + m.shards[0].file) && Contains("horizon is 4") && Contains("implies 5"));
    edit_manifest(dir, [](nlohmann::json& j) {
      j["horizon"] = 4;
      j["text_len"] = 300;
    });
    CHECK_THAT(open_error(dir), Contains("$.record_bytes"));
  }
  SECTION("a missing manifest") {
    REQUIRE(::unlink(manifest.c_str()) == 0);
    CHECK_THAT(open_error(dir), Contains(manifest) && Contains("cannot read"));
  }
}

TEST_CASE("the dataset writer refuses to write into a directory that holds files", "[data]") {
  TempTree tmp;
  write_synthetic_dataset(small_synth(tmp / "ds", 1));
  CHECK_THROWS_WITH(write_synthetic_dataset(small_synth(tmp / "ds", 2)), Contains("not an empty directory"));
  auto bad = small_synth(tmp / "bad", 1);
  bad.min_prompt = 10;
  bad.max_prompt = 5;
  CHECK_THROWS_AS(write_synthetic_dataset(bad), std::invalid_argument);
  CHECK(parse_prompt_range("20:199") == std::pair<int64_t, int64_t>{20, 199});
  CHECK_THROWS_WITH(parse_prompt_range("20-199"), Contains("MIN:MAX"));
  CHECK_THROWS_AS(parse_prompt_range("20:1x"), std::invalid_argument);
}

namespace {

// Rewrites `edit`ed bytes of shard `s` and the manifest's checksum of it, as a hostile or buggy writer would: the
// checksum then vouches for the bytes, and only the record checks stand between them and a training step.
void rewrite_shard(const std::string& dir, const DatasetManifest& m, size_t s,
                   const std::function<void(std::string&)>& edit) {
  const std::string path = dir + "/" + m.shards[s].file;
  std::string bytes = vlatune::test::read_file_bytes(path);
  edit(bytes);
  vlatune::test::write_file_bytes(path, bytes);
  edit_manifest(
      dir, [&](nlohmann::json& j) { j["shards"][s]["checksum"] = format_checksum(xxh64(bytes.data(), bytes.size())); });
}

}  // namespace

TEST_CASE("records are validated on open: token ids, token_len and values, naming the shard and the sample", "[data]") {
  TempTree tmp;
  const std::string dir = tmp / "ds";
  const auto m = write_synthetic_dataset(small_synth(dir, 1));
  const RecordLayout& l = m.layout;
  const std::string shard1 = dir + "/" + m.shards[1].file;
  // Sample 1 of shard 1 is dataset sample 4 (3 samples per shard).
  const int64_t rec = kShardHeaderBytes + 1 * l.record_bytes();
  auto put_i32 = [](std::string& bytes, int64_t at, int32_t v) { std::memcpy(&bytes[static_cast<size_t>(at)], &v, 4); };

  SECTION("a token id outside the vocabulary") {
    rewrite_shard(dir, m, 1, [&](std::string& b) { put_i32(b, rec + l.tokens_offset() + 4 * 2, 9999); });
    CHECK_THAT(open_error(dir), Contains(shard1) && Contains("sample 1 (dataset index 4)") &&
                                    Contains("token 2 is 9999, outside the vocabulary 0..511"));
  }
  SECTION("a negative token id") {
    rewrite_shard(dir, m, 1, [&](std::string& b) { put_i32(b, rec + l.tokens_offset(), -3); });
    CHECK_THAT(open_error(dir), Contains("token 0 is -3"));
  }
  SECTION("a token_len beyond text_len, or negative") {
    rewrite_shard(dir, m, 1, [&](std::string& b) { put_i32(b, rec + l.token_len_offset(), 201); });
    CHECK_THAT(open_error(dir), Contains(shard1) && Contains("token_len 201 outside 0..200"));
    rewrite_shard(dir, m, 1, [&](std::string& b) { put_i32(b, rec + l.token_len_offset(), -1); });
    CHECK_THAT(open_error(dir), Contains("token_len -1"));
  }
  SECTION("a non-finite action or state value") {
    const float nan = std::nanf("");
    rewrite_shard(dir, m, 1,
                  [&](std::string& b) { std::memcpy(&b[static_cast<size_t>(rec + l.actions_offset() + 8)], &nan, 4); });
    CHECK_THAT(open_error(dir), Contains("action value 2 is not finite"));
  }
}
