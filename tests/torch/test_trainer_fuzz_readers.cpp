// The standing fuzz test of the readers in the torch tier (the torch-free ones: tests/core/test_formats_fuzz.cpp):
// safetensors files (header and bytes), packed datasets (manifest.json, and shards whose manifest checksum is
// rewritten to vouch for the damage) and LeRobot datasets (meta/info.json, tasks.jsonl, episodes.jsonl, parquet
// tables). Seeded mutations (tests/core/fuzz_mutator.h); every input is either read or refused with the reader's own
// error type, never a crash, a hang or another exception.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../core/fuzz_mutator.h"
#include "data_test_util.h"
#include "formats/json_error.h"
#include "formats/json_io.h"
#include "model/pi05.h"
#include "model/safetensors_io.h"
#include "model/state_dict.h"
#include "trainer/checksum.h"
#include "trainer/data_error.h"
#include "trainer/dataset.h"
#include "trainer/synthetic.h"

#if defined(VLATUNE_HAVE_LEROBOT_FIXTURE)
#include "tests/lerobot_fixture/lerobot_fixture.h"
#include "trainer/lerobot_dataset.h"
#endif

using vlatune::test::Mutator;
using vlatune::test::read_file_bytes;
using vlatune::test::TempTree;
using vlatune::test::write_file_bytes;

namespace {

// Runs `attempt` on `iterations` inputs; `Refusal` is the one exception type a clean refusal may throw.
template <typename Refusal>
void expect_refusal_or_success(int iterations, const std::function<void(int)>& attempt) {
  int accepted = 0, refused = 0;
  for (int i = 0; i < iterations; ++i) {
    try {
      attempt(i);
      ++accepted;
    } catch (const Refusal&) {
      ++refused;
    } catch (const std::exception& e) {
      FAIL("iteration " << i << ": not a clean refusal: " << e.what());
    }
  }
  INFO("accepted " << accepted << ", refused " << refused);
  CHECK(refused > 0);
}

std::string le_u64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[static_cast<size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

}  // namespace

TEST_CASE("Fuzz: every mutated safetensors file is opened and read, or refused with a SafetensorsError",
          "[safetensors][fuzz]") {
  TempTree tmp;
  const std::string good = tmp / "good.safetensors";
  vlatune::model::write_safetensors(good,
                                    {{"w", torch::randn({3, 4})},
                                     {"b", torch::ones({4}, torch::kBFloat16)},
                                     {"ids", torch::arange(6, torch::kLong).reshape({2, 3})},
                                     {"mask", torch::tensor({true, false, true})},
                                     {"empty", torch::zeros({0, 5})}},
                                    {{"format", "pt"}, {"vlatune.config", "tiny"}});
  const std::string bytes = read_file_bytes(good);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(bytes[static_cast<size_t>(i)]);
  const std::string header = bytes.substr(8, header_len), data = bytes.substr(8 + header_len);
  const std::string path = tmp / "fuzz.safetensors";
  Mutator mutator(11);
  expect_refusal_or_success<vlatune::model::SafetensorsError>(800, [&](int i) {
    std::string file;
    if (i % 4 == 3) {
      file = bytes;  // the whole file as bytes: the length field and the data too
      mutator.mutate_bytes(file, {bytes});
    } else {
      // The header as JSON, the length field rewritten to match (or, now and then, left stale).
      const std::string h = mutator.mutate({header});
      file = le_u64(mutator.chance(8) ? header_len : h.size()) + h + data;
    }
    write_file_bytes(path, file);
    const auto st = vlatune::model::SafetensorsFile::open(path);
    for (const auto& e : st.entries()) st.tensor(e.name);
  });
}

TEST_CASE("Fuzz: a mutated weights file never crashes a load into the tiny model", "[safetensors][fuzz]") {
  TempTree tmp;
  vlatune::model::Pi05 net(vlatune::model::Pi05Config::tiny());
  const std::string good = tmp / "tiny.safetensors";
  vlatune::model::save_state_dict(*net, good);
  const auto file = vlatune::model::SafetensorsFile::open(good);
  CHECK(file.metadata().at(vlatune::model::kConfigMetadataKey) == "tiny");
  const std::string bytes = read_file_bytes(good);
  const std::string path = tmp / "fuzz.safetensors";
  Mutator mutator(12);
  expect_refusal_or_success<vlatune::model::SafetensorsError>(40, [&](int) {
    std::string b = bytes;
    mutator.mutate_bytes(b, {bytes});
    write_file_bytes(path, b);
    vlatune::model::load_state_dict(*net, path, /*strict=*/mutator.chance(2));
  });
}

TEST_CASE("Fuzz: every mutated dataset manifest is opened or refused with a FormatError", "[data][fuzz]") {
  TempTree tmp;
  vlatune::trainer::SynthOptions o;
  o.samples = 6;
  o.horizon = 4;
  o.min_prompt = 3;
  o.max_prompt = 9;
  o.out = tmp / "ds";
  o.shard_bytes = 3 * vlatune::trainer::RecordLayout{2, 28, 200, 4, 7, 8}.record_bytes();
  vlatune::trainer::write_synthetic_dataset(o);
  const std::string manifest = o.out + "/manifest.json";
  const std::string good = read_file_bytes(manifest);
  Mutator mutator(13);
  expect_refusal_or_success<vlatune::formats::FormatError>(300, [&](int) {
    write_file_bytes(manifest, mutator.mutate({good}));
    const auto ds = vlatune::trainer::Dataset::open(o.out);
    for (int64_t i = 0; i < ds->size(); ++i) ds->token_len(i);
  });
}

TEST_CASE("Fuzz: shards damaged under a matching checksum are opened or refused with a FormatError", "[data][fuzz]") {
  TempTree tmp;
  vlatune::trainer::SynthOptions o;
  o.samples = 4;
  o.horizon = 4;
  o.min_prompt = 3;
  o.max_prompt = 9;
  o.out = tmp / "ds";
  vlatune::trainer::write_synthetic_dataset(o);
  const std::string manifest_path = o.out + "/manifest.json";
  const nlohmann::json manifest = vlatune::formats::read_json_file(manifest_path);
  const std::string shard = o.out + "/" + manifest["shards"][0]["file"].get<std::string>();
  const std::string good = read_file_bytes(shard);
  const int64_t record_bytes = manifest["record_bytes"].get<int64_t>();
  Mutator mutator(14);
  expect_refusal_or_success<vlatune::formats::FormatError>(300, [&](int) {
    std::string bytes = good;
    // Flip bytes in the header or in the token/length fields of a record, where the record checks must catch them.
    const int flips = 1 + static_cast<int>(mutator.below(4));
    for (int f = 0; f < flips; ++f) {
      const uint64_t at = mutator.chance(3) ? mutator.below(128)
                                            : vlatune::trainer::kShardHeaderBytes +
                                                  mutator.below(static_cast<uint64_t>(o.samples)) * record_bytes +
                                                  mutator.below(4 * 201 + 4 * 4 * 7);
      bytes[at] = static_cast<char>(bytes[at] ^ (1 << mutator.below(8)));
    }
    if (mutator.chance(10)) mutator.mutate_bytes(bytes, {good});
    write_file_bytes(shard, bytes);
    nlohmann::json m = manifest;
    m["shards"][0]["checksum"] = vlatune::trainer::format_checksum(vlatune::trainer::xxh64(bytes.data(), bytes.size()));
    write_file_bytes(manifest_path, vlatune::formats::dump_json_file(m));
    vlatune::trainer::Dataset::open(o.out);
  });
}

#if defined(VLATUNE_HAVE_LEROBOT_FIXTURE)

TEST_CASE("Fuzz: every mutated LeRobot metadata file or table is read or refused with a DataError",
          "[data][lerobot][fuzz]") {
  TempTree tmp;
  for (const char* version : {"v2.1", "v3.0"}) {
    INFO(version);
    vlatune::testing::LeRobotFixture f;
    f.dir = tmp / version;
    f.version = version;
    f.episode_lengths = {3, 2, 4};
    vlatune::testing::write_lerobot_fixture(f);
    // The text files the reader parses, and the parquet tables (frames; v3.0's episodes and tasks too).
    std::vector<std::string> files = {f.dir + "/meta/info.json"};
    if (std::string(version) == "v2.1") {
      files.push_back(f.dir + "/meta/tasks.jsonl");
      files.push_back(f.dir + "/meta/episodes.jsonl");
    } else {
      files.push_back(f.dir + "/meta/tasks.parquet");
    }
    files.push_back(vlatune::testing::fixture_data_file(f, 0));
    Mutator mutator(15);
    for (const auto& file : files) {
      INFO(file);
      const std::string good = read_file_bytes(file);
      const bool text =
          file.size() > 5 && (file.substr(file.size() - 5) == ".json" || file.substr(file.size() - 6) == ".jsonl");
      expect_refusal_or_success<vlatune::trainer::DataError>(text ? 150 : 60, [&](int) {
        std::string bytes = good;
        if (!text) {
          mutator.mutate_bytes(bytes, {good});
        } else if (file.back() == 'l') {
          // JSON lines: one line mutated as a JSON document, the others kept.
          std::vector<std::string> lines;
          for (size_t at = 0; at < good.size();) {
            const size_t nl = good.find('\n', at);
            lines.push_back(good.substr(at, nl == std::string::npos ? std::string::npos : nl - at));
            at = nl == std::string::npos ? good.size() : nl + 1;
          }
          std::string& line = lines[mutator.below(lines.size())];
          line = mutator.mutate({line});
          bytes.clear();
          for (const auto& l : lines) bytes += l + "\n";
        } else {
          bytes = mutator.mutate({good});
        }
        write_file_bytes(file, bytes);
        const auto d = vlatune::trainer::read_lerobot_dataset(f.dir);
        std::map<std::string, std::vector<size_t>> by_file;
        for (size_t e = 0; e < d.episodes.size(); ++e) by_file[d.episodes[e].data_file].push_back(e);
        for (const auto& [data_file, episodes] : by_file)
          vlatune::trainer::read_lerobot_frames(d, data_file, episodes, f.state_key, f.state_dim, f.action_key,
                                                f.action_dim, 1e-4);
      });
      write_file_bytes(file, good);
    }
  }
}

#endif
