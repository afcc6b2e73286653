// A run directory belongs to one run (trainer/run_dir.h, trainer/checkpoint.h): locked for the run's life, never
// taken over from someone else's data, pruned only of the run's own checkpoints, resumable after a kill at any
// point, and checked (checksums, state values) before anything is loaded. Tiny config on the CPU.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <optional>
#include <sstream>
#include <string>

#include "data_test_util.h"
#include "formats/checkpoint_state.h"
#include "formats/json_error.h"
#include "formats/json_io.h"
#include "formats/metrics_jsonl.h"
#include "formats/recipe.h"
#include "formats/run_record.h"
#include "formats/train_config.h"
#include "tiny_train_options.h"
#include "trainer/checkpoint.h"
#include "trainer/file_util.h"
#include "trainer/run_dir.h"
#include "trainer/synthetic.h"
#include "trainer/train_loop.h"

namespace {

using vlatune::test::TempTree;
using vlatune::trainer::run_training;
using vlatune::trainer::TrainOptions;

// A checkpoint after every step, all kept: the cases resume from, damage or prune any step's.
TrainOptions tiny_run(const std::string& out, int64_t steps) {
  TrainOptions o = vlatune::test::tiny_train_options(out, steps);
  o.checkpoint_every = 1;
  o.keep_last = 10;
  return o;
}

TrainOptions resume_of(const std::string& dir, std::optional<int64_t> steps = std::nullopt) {
  TrainOptions o;
  o.resume = dir;
  o.steps = steps;
  o.progress_bar = false;
  return o;
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

void copy_dir_flat(const std::string& from, const std::string& to) {
  REQUIRE(::mkdir(to.c_str(), 0755) == 0);
  for (const char* name : {"model.safetensors", "optimizer.safetensors", "state.json"})
    vlatune::test::write_file_bytes(to + "/" + name, vlatune::test::read_file_bytes(from + "/" + name));
}

}  // namespace

TEST_CASE("A second train on a run directory in use is refused at once", "[train][run_dir]") {
  TempTree tmp;
  const std::string dir = tmp / "run";
  REQUIRE(::mkdir(dir.c_str(), 0755) == 0);
  // What the first `train` holds for its whole life: an exclusive lock on RUNDIR/train.lock.
  const int fd = ::open((dir + "/train.lock").c_str(), O_RDWR | O_CREAT, 0644);
  REQUIRE(fd >= 0);
  REQUIRE(::flock(fd, LOCK_EX | LOCK_NB) == 0);
  std::ostringstream log;
  REQUIRE_THROWS_WITH(run_training(tiny_run(dir, 1), log),
                      Catch::Contains(dir) && Catch::Contains("in use by another vlatune train"));
  CHECK_FALSE(exists(dir + "/metrics.jsonl"));
  ::close(fd);
  CHECK_NOTHROW(run_training(tiny_run(dir, 1), log));  // free again: the directory held only the lock file
}

TEST_CASE("A new run refuses a directory holding anything but its own lock file, and touches nothing there",
          "[train][run_dir]") {
  TempTree tmp;
  std::ostringstream log;
  // A foreign run.json.
  const std::string a = tmp / "a";
  REQUIRE(::mkdir(a.c_str(), 0755) == 0);
  vlatune::test::write_file_bytes(a + "/run.json", "{\"theirs\": true}");
  REQUIRE_THROWS_WITH(run_training(tiny_run(a, 1), log),
                      Catch::Contains("not empty and not a vlatune run") && Catch::Contains("run.json"));
  CHECK(vlatune::test::read_file_bytes(a + "/run.json") == "{\"theirs\": true}");
  CHECK_FALSE(exists(a + "/train.lock"));
  // Checkpoints this run did not write (another run's, copied in): never pruned, never resumed from.
  const std::string src = tmp / "src";
  run_training(tiny_run(src, 2), log);
  const std::string b = tmp / "b";
  REQUIRE(::mkdir(b.c_str(), 0755) == 0);
  REQUIRE(::mkdir((b + "/checkpoints").c_str(), 0755) == 0);
  copy_dir_flat(src + "/checkpoints/step_00000001", b + "/checkpoints/step_00000001");
  REQUIRE_THROWS_WITH(run_training(tiny_run(b, 3), log), Catch::Contains("checkpoints"));
  CHECK(exists(b + "/checkpoints/step_00000001/model.safetensors"));
  CHECK_FALSE(exists(b + "/metrics.jsonl"));
}

TEST_CASE("Resume refuses checkpoints of another run and a symlinked checkpoints directory", "[train][run_dir]") {
  TempTree tmp;
  std::ostringstream log;
  const std::string mine = tmp / "mine", theirs = tmp / "theirs";
  run_training(tiny_run(mine, 2), log);
  run_training(tiny_run(theirs, 2), log);
  // Another run's checkpoint with a later step: resuming from it would continue someone else's run.
  copy_dir_flat(theirs + "/checkpoints/step_00000002", mine + "/checkpoints/step_00000099");
  REQUIRE_THROWS_WITH(run_training(resume_of(mine, 200), log),
                      Catch::Contains("step_00000099") && Catch::Contains("not a checkpoint of this run"));
  CHECK(exists(mine + "/checkpoints/step_00000099/state.json"));  // left alone
  vlatune::trainer::remove_tree(mine + "/checkpoints/step_00000099");
  // checkpoints/ as a link to a directory elsewhere.
  REQUIRE(::rename((mine + "/checkpoints").c_str(), (tmp / "elsewhere").c_str()) == 0);
  REQUIRE(::symlink((tmp / "elsewhere").c_str(), (mine + "/checkpoints").c_str()) == 0);
  REQUIRE_THROWS_WITH(run_training(resume_of(mine, 3), log), Catch::Contains("symbolic link"));
  CHECK(exists(tmp / "elsewhere/step_00000002/model.safetensors"));
}

TEST_CASE("Pruning removes only the run's own checkpoints, only their files, never through a link",
          "[train][run_dir]") {
  TempTree tmp;
  std::ostringstream log;
  const std::string mine = tmp / "mine", theirs = tmp / "theirs";
  run_training(tiny_run(mine, 3), log);
  run_training(tiny_run(theirs, 1), log);
  const std::string root = mine + "/checkpoints";
  const std::string run_id = vlatune::formats::read_train_config(mine + "/train_config.json").run_id;
  // Another run's checkpoint among ours, a file of the user's inside our oldest, and a link named like a
  // checkpoint pointing at the other run's.
  copy_dir_flat(theirs + "/checkpoints/step_00000001", root + "/step_00000000");
  vlatune::test::write_file_bytes(root + "/step_00000001/notes.txt", "keep me");
  REQUIRE(::symlink((theirs + "/checkpoints/step_00000001").c_str(), (root + "/step_00000005").c_str()) == 0);
  const std::vector<std::string> warnings = vlatune::trainer::prune_checkpoints(mine, run_id, 1);
  CHECK(exists(root + "/step_00000000/model.safetensors"));  // not ours: untouched
  CHECK(exists(theirs + "/checkpoints/step_00000001/model.safetensors"));
  CHECK_FALSE(exists(root + "/step_00000002"));              // ours: removed
  CHECK(exists(root + "/step_00000003/model.safetensors"));  // the newest kept
  // Ours with a file we did not write: our files removed, the user's kept, and a warning instead of a failure.
  REQUIRE(warnings.size() == 1);
  CHECK_THAT(warnings[0], Catch::Contains("did not write"));
  CHECK(vlatune::test::read_file_bytes(root + "/.step_00000001.removing.tmp/notes.txt") == "keep me");
  CHECK_FALSE(exists(root + "/.step_00000001.removing.tmp/model.safetensors"));
  // Clearing the temporaries on resume keeps the user's file too, with a warning again.
  const std::vector<std::string> lines = vlatune::trainer::remove_leftover_temporaries(mine);
  REQUIRE(lines.size() == 1);
  CHECK_THAT(lines[0], Catch::StartsWith("warning: ") && Catch::Contains("did not write"));
  CHECK(vlatune::test::read_file_bytes(root + "/.step_00000001.removing.tmp/notes.txt") == "keep me");
}

TEST_CASE("A run killed before its first checkpoint resumes from step 0, its leftover temporaries removed",
          "[train][run_dir]") {
  TempTree tmp;
  std::ostringstream log;
  const std::string dir = tmp / "run";
  auto o = tiny_run(dir, 2);
  o.checkpoint_every = 0;
  run_training(o, log);
  const auto straight = vlatune::formats::read_metrics(dir + "/metrics.jsonl");
  // What a kill before the first checkpoint leaves: settings, recipe, some metrics, half-written files.
  vlatune::trainer::remove_tree(dir + "/checkpoints");
  vlatune::trainer::remove_tree(dir + "/final");
  ::unlink((dir + "/run.json").c_str());
  REQUIRE(::mkdir((dir + "/checkpoints").c_str(), 0755) == 0);
  REQUIRE(::mkdir((dir + "/checkpoints/.step_00000001.tmp").c_str(), 0755) == 0);
  vlatune::test::write_file_bytes(dir + "/checkpoints/.step_00000001.tmp/model.safetensors", "half");
  vlatune::test::write_file_bytes(dir + "/run.json.tmp.Ab12Cd", "{");
  vlatune::test::write_file_bytes(dir + "/notes.txt", "mine");
  std::ostringstream resume_log;
  const auto r = run_training(resume_of(dir), resume_log);
  INFO(resume_log.str());
  CHECK(r.first_step == 0);
  CHECK(r.last_step == 2);
  CHECK_THAT(resume_log.str(), Catch::Contains("starts again from step 0"));
  CHECK_FALSE(exists(dir + "/checkpoints/.step_00000001.tmp"));
  CHECK_FALSE(exists(dir + "/run.json.tmp.Ab12Cd"));
  CHECK(exists(dir + "/notes.txt"));
  const auto rows = vlatune::formats::read_metrics(dir + "/metrics.jsonl");
  REQUIRE(rows.size() == 2);
  for (size_t i = 0; i < rows.size(); ++i) CHECK(rows[i].loss == straight[i].loss);
}

TEST_CASE("Resume of a finished run, or to no more steps than done, is refused naming the step", "[train][run_dir]") {
  TempTree tmp;
  std::ostringstream log;
  const std::string dir = tmp / "run";
  run_training(tiny_run(dir, 2), log);
  REQUIRE_THROWS_WITH(run_training(resume_of(dir), log),
                      Catch::Contains("finished (step 2 of 2)") && Catch::Contains("--steps above 2"));
  REQUIRE_THROWS_WITH(run_training(resume_of(dir, 2), log),
                      Catch::Contains("--steps 2") && Catch::Contains("at step 2 already"));
  CHECK(vlatune::formats::read_metrics(dir + "/metrics.jsonl").size() == 2);  // nothing lost
}

TEST_CASE("A damaged checkpoint file or an out-of-range state value is refused on resume", "[train][run_dir]") {
  TempTree tmp;
  std::ostringstream log;
  const std::string dir = tmp / "run";
  run_training(tiny_run(dir, 2), log);
  const std::string ck = dir + "/checkpoints/step_00000002";
  const std::string model = ck + "/model.safetensors";
  const std::string original = vlatune::test::read_file_bytes(model);
  std::string damaged = original;
  damaged[damaged.size() - 3] ^= 0x10;  // one bit of the last tensor
  vlatune::test::write_file_bytes(model, damaged);
  REQUIRE_THROWS_WITH(run_training(resume_of(dir, 3), log),
                      Catch::Contains(model) && Catch::Contains("checksum") && Catch::Contains("damaged"));
  vlatune::test::write_file_bytes(model, original);

  nlohmann::json state = vlatune::formats::read_json_file(ck + "/state.json");
  const nlohmann::json good = state;
  state["trainer"]["seed"] = 6;  // another run's seed
  vlatune::test::write_file_bytes(ck + "/state.json", state.dump());
  REQUIRE_THROWS_WITH(run_training(resume_of(dir, 3), log), Catch::Contains("$.trainer.seed"));
  state = good;
  state["trainer"]["skipped_steps"] = 7;  // more than the steps done
  vlatune::test::write_file_bytes(ck + "/state.json", state.dump());
  REQUIRE_THROWS_WITH(run_training(resume_of(dir, 3), log), Catch::Contains("$.trainer.skipped_steps"));
  vlatune::test::write_file_bytes(ck + "/state.json", good.dump());
  CHECK(run_training(resume_of(dir, 3), log).last_step == 3);
}

TEST_CASE("train_config.json stores absolute paths: a run resumes from any working directory", "[train][run_dir]") {
  TempTree tmp;
  std::ostringstream log;
  vlatune::trainer::SynthOptions synth;
  synth.samples = 8;
  synth.text_len = 32;
  synth.min_prompt = 4;
  synth.max_prompt = 16;
  synth.horizon = 4;
  synth.out = tmp / "data";
  vlatune::trainer::write_synthetic_dataset(synth);
  vlatune::test::write_file_bytes(tmp / "r.json", R"({"schema": "vlatune.recipe/1", "data": {"trim_multiple": 8}})");
  char cwd[4096];
  REQUIRE(::getcwd(cwd, sizeof cwd) != nullptr);
  REQUIRE(::chdir(tmp.path.c_str()) == 0);
  auto o = tiny_run("run", 1);  // every path relative to the working directory
  o.data = "data";
  o.recipe_path = "r.json";
  try {
    run_training(o, log);
  } catch (...) {
    REQUIRE(::chdir(cwd) == 0);
    throw;
  }
  REQUIRE(::chdir("/") == 0);
  INFO(log.str());
  const auto config = vlatune::formats::read_train_config(tmp / "run/train_config.json");
  CHECK(config.data == tmp / "data");
  CHECK(config.recipe_source == tmp / "r.json");
  ::unlink((tmp / "r.json").c_str());  // the run's own copy of the recipe is the one resume uses
  const auto r = run_training(resume_of(tmp / "run", 2), log);
  REQUIRE(::chdir(cwd) == 0);
  CHECK(r.last_step == 2);
  CHECK(vlatune::formats::read_recipe(tmp / "run/recipe.json").data.trim_multiple == 8);
  CHECK(vlatune::formats::read_run_record(tmp / "run/run.json").data == tmp / "data");
}
