// `train` writes a TensorBoard event file beside metrics.jsonl (trainer/tensorboard_log.h) holding the same rows,
// a resumed run a second one that marks its restart; `--no-tensorboard` writes none.
#ifdef VLATUNE_HAVE_TENSORBOARD

#include <catch2/catch.hpp>

#include <dirent.h>

#include <algorithm>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "formats/metrics_jsonl.h"
#include "formats/tensorboard_events.h"
#include "tests/torch/cli_test_util.h"
#include "tiny_train_options.h"
#include "trainer/tensorboard_log.h"
#include "trainer/train_loop.h"

namespace {

// The run directory's event files, oldest first (names start with the Unix second they were opened).
std::vector<std::string> event_files(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d))
      if (std::string(e->d_name).rfind("events.out.tfevents.", 0) == 0) out.push_back(dir + "/" + e->d_name);
    ::closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<vlatune::formats::ScalarEvent> tagged(const vlatune::formats::EventFileContents& c,
                                                  const std::string& tag) {
  std::vector<vlatune::formats::ScalarEvent> out;
  for (const auto& s : c.scalars)
    if (s.tag == tag) out.push_back(s);
  return out;
}

}  // namespace

TEST_CASE("A run's event file holds its metrics rows, and a resumed run marks its restart", "[train][tensorboard]") {
  const std::string dir = vlatune::test::temp_dir("train-tb") + "/run";
  std::ostringstream log;
  vlatune::trainer::run_training(vlatune::test::tiny_train_options(dir, 2), log);
  vlatune::trainer::TrainOptions again;
  again.resume = dir;
  again.steps = 4;
  again.progress_bar = false;
  vlatune::trainer::run_training(again, log);

  const auto rows = vlatune::formats::read_metrics(dir + "/metrics.jsonl");
  REQUIRE(rows.size() == 4);
  const auto files = event_files(dir);
  REQUIRE(files.size() == 2);
  const auto first = vlatune::formats::read_event_file(files[0]);
  const auto second = vlatune::formats::read_event_file(files[1]);
  CHECK(first.session_starts.empty());
  CHECK(second.session_starts == std::vector<int64_t>{2});
  auto loss = tagged(first, "train/loss");
  const auto resumed_loss = tagged(second, "train/loss");
  loss.insert(loss.end(), resumed_loss.begin(), resumed_loss.end());
  REQUIRE(loss.size() == 4);
  for (size_t i = 0; i < 4; ++i) {
    CHECK(loss[i].step == rows[i].step);
    CHECK(loss[i].value == static_cast<float>(rows[i].loss));
  }
  const auto lr = tagged(second, "train/lr");
  REQUIRE(lr.size() == 2);
  CHECK(lr[1].value == static_cast<float>(rows[3].lr));
  CHECK(tagged(first, "train/samples_per_s").size() == 2);
  const auto peak = tagged(first, "train/peak_gib");
  REQUIRE(peak.size() == 2);
  CHECK(peak[1].value == static_cast<float>(rows[1].peak_gib));
}

TEST_CASE("Scalars of other rows (evaluation) go to the event file, non-finite ones left out", "[train][tensorboard]") {
  const std::string dir = vlatune::test::temp_dir("eval-tb");
  std::ostringstream log;
  {
    vlatune::trainer::TensorBoardLog tb(dir, 0, false, log);
    tb.add(7, {{"eval/loss", 0.5}, {"eval/action_mae", std::numeric_limits<double>::quiet_NaN()}});
  }
  const auto files = event_files(dir);
  REQUIRE(files.size() == 1);
  const auto c = vlatune::formats::read_event_file(files[0]);
  REQUIRE(c.scalars.size() == 1);
  CHECK(c.scalars[0].tag == "eval/loss");
  CHECK(c.scalars[0].step == 7);
  CHECK(c.scalars[0].value == 0.5f);
}

TEST_CASE("train --no-tensorboard writes metrics.jsonl and no event file", "[train][tensorboard][cli]") {
  const std::string dir = vlatune::test::temp_dir("train-no-tb") + "/run";
  const auto r = vlatune::test::run_cli({"train", "--config", "tiny", "--device", "cpu", "--data", "synthetic",
                                         "--batch", "2", "--steps", "1", "--workers", "1", "--no-save", "--no-progress",
                                         "--out", dir, "--no-tensorboard"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK(vlatune::formats::read_metrics(dir + "/metrics.jsonl").size() == 1);
  CHECK(event_files(dir).empty());
}

#endif  // VLATUNE_HAVE_TENSORBOARD
