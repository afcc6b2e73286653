// TensorBoard event files (formats/tensorboard_events.h): the TFRecord framing against known CRC32C values, our
// reader on good and damaged files, and TensorBoard's own loader (tests/core/read_tensorboard_events.py, in the
// venv scripts/setup.sh makes) on what the writer and a training row produce, a resumed run included.
#ifdef VLATUNE_HAVE_TENSORBOARD

#include <catch2/catch.hpp>

#include <dirent.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/file_io.h"
#include "formats/json_error.h"
#include "formats/tensorboard_events.h"
#include "temp_dir.h"
#include "tests/core/trace_readers.h"

using vlatune::formats::EventFileWriter;
using vlatune::formats::FormatError;

namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void spit(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

std::vector<std::string> event_files(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d))
      if (std::string(e->d_name).find("tfevents") != std::string::npos) out.push_back(dir + "/" + e->d_name);
    ::closedir(d);
  }
  return out;
}

}  // namespace

TEST_CASE("CRC32C and TFRecord's masked CRC match the published values", "[formats][tensorboard]") {
  const std::string digits = "123456789";
  CHECK(vlatune::formats::crc32c(digits.data(), digits.size()) == 0xe3069283u);  // the CRC-32C check value
  const std::string zeros(32, '\0');
  CHECK(vlatune::formats::crc32c(zeros.data(), zeros.size()) == 0x8a9136aau);  // RFC 3720 B.4, 32 zero bytes
  // Masks as TensorBoard's own masked_crc32c computes them.
  CHECK(vlatune::formats::masked_crc32c("", 0) == 0xa282ead8u);
  CHECK(vlatune::formats::masked_crc32c(digits.data(), digits.size()) == 0xc78ab0e5u);
  // A record of empty data: length 0 (8 bytes), the masked CRC of those 8 zero bytes, nothing, the masked CRC of "".
  const std::string record = vlatune::formats::frame_record("");
  REQUIRE(record.size() == 16);
  CHECK(record.substr(0, 8) == std::string(8, '\0'));
  CHECK(record.substr(8, 4) == std::string("\x29\x03\x98\x07", 4));  // 0x07980329 little-endian
  CHECK(record.substr(12, 4) == std::string("\xd8\xea\x82\xa2", 4));
}

TEST_CASE("An event file reads back with its file version, scalars and session starts", "[formats][tensorboard]") {
  vlatune::test::TempDir dir("tb_roundtrip");
  std::string path;
  {
    EventFileWriter w(dir.path, 1000.0);
    path = w.path();
    w.add_scalar("train/loss", 3, 0.25, 1001.5);
    w.add_session_start(4, 1002.0);
    w.add_scalar("train/lr", 4, 1e-4, 1002.5);
    w.flush();
  }
  CHECK(path.find("/events.out.tfevents.1000.") != std::string::npos);
  const auto contents = vlatune::formats::read_event_file(path);
  CHECK(contents.file_version == "brain.Event:2");
  REQUIRE(contents.scalars.size() == 2);
  CHECK(contents.scalars[0].tag == "train/loss");
  CHECK(contents.scalars[0].step == 3);
  CHECK(contents.scalars[0].value == 0.25f);
  CHECK(contents.scalars[0].wall_time == 1001.5);
  CHECK(contents.scalars[1].value == 1e-4f);
  CHECK(contents.session_starts == std::vector<int64_t>{4});
}

TEST_CASE("The event-file reader refuses damaged files, naming the file and the record", "[formats][tensorboard]") {
  vlatune::test::TempDir dir("tb_damaged");
  std::string path;
  {
    EventFileWriter w(dir.path, 1000.0);
    path = w.path();
    w.add_scalar("train/loss", 0, 1.0, 1000.0);
  }
  const std::string good = slurp(path);
  const std::string bad = dir.file("events.out.tfevents.bad");
  auto refused = [&](const std::string& bytes, const std::string& reason) {
    spit(bad, bytes);
    try {
      vlatune::formats::read_event_file(bad);
      FAIL("accepted: " << reason);
    } catch (const FormatError& e) {
      CHECK(e.file() == bad);
      CHECK(std::string(e.what()).find(reason) != std::string::npos);
      CHECK(e.json_path().rfind("record ", 0) == 0);
    }
  };
  std::string flipped = good;
  flipped[flipped.size() - 6] ^= 0x40;  // inside the last record's data
  refused(flipped, "data CRC mismatch");
  refused(good.substr(0, good.size() - 1), "truncated record");
  refused(good.substr(0, good.size() - 3 - 16), "truncated record");
  std::string length = good;
  length[0] ^= 0x01;
  refused(length, "length CRC mismatch");
  // Without its first record: a valid record whose event is a scalar, not the file version.
  refused(good.substr(12 + static_cast<unsigned char>(good[0]) + 4), "first event must hold file_version");
  refused("", "empty event file");
  refused(vlatune::formats::frame_record("\xff\xff\xff"), "not an Event message");
}

TEST_CASE("An event file that cannot be created is a WriteError naming it", "[formats][tensorboard]") {
  vlatune::test::TempDir dir("tb_unwritable");
  try {
    EventFileWriter w(dir.file("missing"), 1000.0);
    FAIL("created " << w.path());
  } catch (const vlatune::formats::WriteError& e) {
    CHECK(e.file().rfind(dir.file("missing/events.out.tfevents.1000."), 0) == 0);
    CHECK(std::string(e.what()).find("No such file or directory") != std::string::npos);
  }
}

TEST_CASE("TensorBoard's own loader reads the training rows, a resumed run's restart included",
          "[formats][tensorboard][readers]") {
  const std::string python = vlatune::test::trace_readers_python();
  if (python.empty()) {
    WARN("no .vlatune/trace-readers-python (scripts/setup.sh makes it): TensorBoard's loader not run");
    return;
  }
  vlatune::test::TempDir dir("tb_reader");
  auto row = [](int64_t step, double loss) {
    vlatune::formats::MetricsRow r;
    r.step = step;
    r.loss = loss;
    r.grad_norm = 0.5 + step;
    r.lr = 1e-5 * (step + 1);
    r.samples_per_s = 40 + step;
    r.step_ms = 700 + step;
    r.data_wait_ms = 0.25;
    r.peak_gib = std::numeric_limits<double>::quiet_NaN();  // not measured (CPU): left out
    return r;
  };
  {
    EventFileWriter first(dir.path, 1000.0);
    for (int64_t s = 0; s < 5; ++s) vlatune::formats::add_metrics_row(&first, row(s, 1.0 + s), 1000.0 + s);
    auto skipped = row(5, std::numeric_limits<double>::quiet_NaN());
    vlatune::formats::add_metrics_row(&first, skipped, 1005.0);
  }
  {
    // Resumed from the checkpoint after step 2: steps 3.. are redone with other losses.
    EventFileWriter resumed(dir.path, 2000.0);
    resumed.add_session_start(3, 2000.0);
    for (int64_t s = 3; s < 6; ++s) vlatune::formats::add_metrics_row(&resumed, row(s, 10.0 + s), 2000.0 + s);
  }
  REQUIRE(event_files(dir.path).size() == 2);
  const auto run = vlatune::test::run_reader(python, "read_tensorboard_events.py", dir.path);
  INFO(run.output);
  REQUIRE(run.status == 0);
  const auto j = nlohmann::json::parse(run.output.substr(run.output.rfind("{\"scalars\"")));
  const auto& scalars = j.at("scalars");
  for (const char* tag :
       {"train/loss", "train/grad_norm", "train/lr", "train/samples_per_s", "train/step_ms", "train/data_wait_ms"})
    CHECK(scalars.contains(tag));
  CHECK_FALSE(scalars.contains("train/peak_gib"));
  const auto& loss = scalars.at("train/loss");
  REQUIRE(loss.size() == 6);
  const double expected[] = {1, 2, 3, 13, 14, 15};  // the first file's 3.. dropped by the restart at 3
  for (size_t i = 0; i < 6; ++i) {
    CHECK(loss[i][0].get<int64_t>() == static_cast<int64_t>(i));
    CHECK(loss[i][1].get<double>() == Approx(expected[i]));
  }
  CHECK(scalars.at("train/lr")[2][1].get<double>() == Approx(3e-5).epsilon(1e-6));
  CHECK(loss[4][2].get<double>() == 2004.0);
}

#endif  // VLATUNE_HAVE_TENSORBOARD
