// `vlatune plan` through the command line: a recipe from the profile fixture, bad input exits 4 naming the file
// and JSON path or the flag, and a train run with a planned recipe reports predicted vs measured.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cli/cli.h"
#include "cli_test_util.h"
#include "formats/profile.h"
#include "formats/recipe.h"

namespace {

using vlatune::test::CliResult;
using vlatune::test::run_cli;

std::string temp_dir() {
  return vlatune::test::temp_dir("plan");
}

const std::string kProfile = std::string(VLATUNE_FIXTURES_DIR) + "/profile_synthetic_pi05.json";

}  // namespace

TEST_CASE("vlatune plan writes an explained recipe and the grid candidates", "[cli][plan]") {
  const std::string dir = temp_dir();
  auto r = run_cli({"plan", "--profile", kProfile, "--out", dir + "/recipe.json", "--batch", "32", "--explain",
                    "--grid", "3", "--grid-dir", dir + "/grid"});
  REQUIRE(r.code == 0);
  CHECK(r.out.find("memory budget 132.8 GiB") != std::string::npos);
  CHECK(r.out.find("predicted: step") != std::string::npos);
  CHECK(r.out.find("grid candidate 2: ") != std::string::npos);
  const auto recipe = vlatune::formats::read_recipe(dir + "/recipe.json");
  CHECK(recipe.predicted.step_ms);
  CHECK(recipe.tuned_on.profile == std::optional<std::string>(kProfile));
  auto cmp = run_cli({"plan", "--compare-grid", dir + "/grid"});
  CHECK(cmp.code == 0);
  CHECK(cmp.out.find("not measured yet") != std::string::npos);
}

TEST_CASE("vlatune plan --explain without --out prints the plan and writes nothing", "[cli][plan]") {
  auto r = run_cli({"plan", "--profile", kProfile, "--batch", "32", "--explain"});
  REQUIRE(r.code == 0);
  CHECK(r.out.find("predicted: step") != std::string::npos);
  CHECK(r.out.find("samples/s)\n") == std::string::npos);  // no "recipe: FILE (predicted ...)" line
  auto neither = run_cli({"plan", "--profile", kProfile});
  CHECK(neither.code == vlatune::cli::kExitBadInput);
  CHECK(neither.err.find("--out") != std::string::npos);
}

TEST_CASE("vlatune plan exits 4 on a bad profile or flag, naming it", "[cli][plan]") {
  const std::string dir = temp_dir();
  {
    std::ifstream in(kProfile);
    std::stringstream s;
    s << in.rdbuf();
    std::string text = s.str();
    text.replace(text.find("\"peak_gib\": 90.1"), 16, "\"peak_gib\": null");
    std::ofstream(dir + "/bad.json") << text;
  }
  auto bad = run_cli({"plan", "--profile", dir + "/bad.json", "--out", dir + "/r.json"});
  CHECK(bad.code == vlatune::cli::kExitBadInput);
  CHECK(bad.err.find(dir + "/bad.json: $.batches[0].peak_gib") != std::string::npos);
  auto batch = run_cli({"plan", "--profile", kProfile, "--out", dir + "/r.json", "--batch", "many"});
  CHECK(batch.code == vlatune::cli::kExitBadInput);
  CHECK(batch.err.find("--batch") != std::string::npos);
  auto budget =
      run_cli({"plan", "--profile", kProfile, "--out", dir + "/r.json", "--batch", "32", "--memory-budget", "10"});
  CHECK(budget.code == vlatune::cli::kExitBadInput);
  CHECK(budget.err.find("--memory-budget") != std::string::npos);
  auto world = run_cli({"plan", "--profile", kProfile, "--out", dir + "/r.json", "--world-size", "4"});
  CHECK(world.code == vlatune::cli::kExitBadInput);
  CHECK(world.err.find("--allreduce-gbps") != std::string::npos);
}

TEST_CASE("vlatune train reports predicted vs measured step time for a planned recipe", "[cli][plan][train]") {
  const std::string dir = temp_dir();
  std::ofstream(dir + "/recipe.json") << R"({"batch": {"micro_batch": 2}, "predicted": {"step_ms": 1.0}})";
  auto r = run_cli(
      {"train",      "--config",           "tiny", "--device",     "cpu", "--data",   "synthetic",          "--steps",
       "3",          "--timing-warmup",    "1",    "--workers",    "1",   "--recipe", dir + "/recipe.json", "--out",
       dir + "/run", "--checkpoint-every", "0",    "--no-progress"});
  REQUIRE(r.code == 0);
  CHECK(r.out.find("plan: step time measured ") != std::string::npos);
  CHECK(r.out.find(", predicted 1.00 ms (the prediction is ") != std::string::npos);
}

TEST_CASE("vlatune plan: --out over its --profile is refused (4); an unwritable --out is a failure (1)",
          "[cli][plan]") {
  const std::string dir = temp_dir();
  {
    std::ifstream in(kProfile);
    std::stringstream s;
    s << in.rdbuf();
    std::ofstream(dir + "/profile.json") << s.str();
  }
  auto same = run_cli({"plan", "--profile", dir, "--out", dir + "/profile.json"});
  CHECK(same.code == vlatune::cli::kExitBadInput);
  CHECK(same.err.find("same file as --profile") != std::string::npos);
  CHECK(vlatune::formats::read_profile(dir + "/profile.json").batches.size() > 0);  // untouched
  auto unwritable = run_cli({"plan", "--profile", dir, "--out", dir + "/no/such/dir/recipe.json"});
  CHECK(unwritable.code == vlatune::cli::kExitFailure);
  CHECK(unwritable.err.find(dir + "/no/such/dir/recipe.json") != std::string::npos);
  REQUIRE(::mkfifo((dir + "/fifo.json").c_str(), 0600) == 0);
  auto fifo = run_cli({"plan", "--profile", dir + "/fifo.json", "--out", dir + "/r.json"});
  CHECK(fifo.code == vlatune::cli::kExitBadInput);  // refused at once, where it used to wait for a writer
  CHECK(fifo.err.find("not a regular file") != std::string::npos);
}

TEST_CASE("vlatune plan plans a CPU profile from its estimated peak and this machine's memory, and says so",
          "[cli][plan][profiler]") {
  // One intra-op thread: step times that grow with the batch on a busy machine. Restored after, as the op-count
  // baseline is taken at the default.
  struct Threads {
    int before = at::get_num_threads();
    Threads() { torch::set_num_threads(1); }
    ~Threads() { torch::set_num_threads(before); }
  } one_thread;
  const std::string dir = temp_dir();
  // The CPU runs gate_proj and up_proj apart: its profile has an A/B row for the merged gate+up units but no merged
  // GEMM to price them by, which the planner must take as a row that calibrates nothing.
  // Batch 4 and its profiled half, one warm-up step: batch 1 against 2 measured within timing noise on a busy
  // machine, and a profile whose step time does not grow with the batch cannot be planned.
  auto prof =
      run_cli({"profile", "--config", "tiny", "--device", "cpu", "--data", "synthetic", "--batch", "4", "--warmup", "1",
               "--timed-steps", "2", "--steps", "1", "--ab-steps", "1", "--out", dir + "/profile"});
  REQUIRE(prof.code == 0);
  const vlatune::formats::Profile written = vlatune::formats::read_profile(dir + "/profile/profile.json");
  CHECK(written.settings.workload == "train");
  CHECK_FALSE(written.settings.compute_capability);  // a CPU has none
  auto r = run_cli({"plan", "--profile", dir + "/profile", "--batch", "2", "--explain", "--out", dir + "/r.json"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("this machine's") != std::string::npos);
  CHECK(r.out.find("estimated (a CPU profile measures no device peak)") != std::string::npos);
  CHECK(vlatune::formats::read_recipe(dir + "/r.json").batch.micro_batch == 2);
}

TEST_CASE("vlatune plan --gpu, --list-gpus, --allow and --global-batch through the command line", "[cli][plan]") {
  const std::string dir = temp_dir();
  auto list = run_cli({"plan", "--list-gpus"});
  REQUIRE(list.code == 0);
  CHECK(list.out.find("RTX 4090") != std::string::npos);
  CHECK(list.out.find("A100-80GB") != std::string::npos);
  auto unknown = run_cli({"plan", "--profile", kProfile, "--explain", "--gpu", "Voodoo 2"});
  CHECK(unknown.code == vlatune::cli::kExitBadInput);
  CHECK(unknown.err.find("--gpu: unknown GPU 'Voodoo 2'; known: RTX 3090, RTX 4090") != std::string::npos);
  auto bad_allow = run_cli({"plan", "--profile", kProfile, "--explain", "--allow", "global-batch,freez"});
  CHECK(bad_allow.code == vlatune::cli::kExitBadInput);
  CHECK(bad_allow.err.find("--allow: unknown choice 'freez' (known: global-batch, optimizer-state, freeze, lora") !=
        std::string::npos);
  auto undivided = run_cli({"plan", "--profile", kProfile, "--explain", "--global-batch", "24", "--batch", "16"});
  CHECK(undivided.code == vlatune::cli::kExitBadInput);
  CHECK(undivided.err.find("--batch 16 does not divide --global-batch 24") != std::string::npos);
  // 30 GiB: global batch 32 does not fit with bf16 moments; the error names the --allow choices that would.
  auto tight = run_cli({"plan", "--profile", kProfile, "--out", dir + "/r.json", "--memory-budget", "30"});
  CHECK(tight.code == vlatune::cli::kExitBadInput);
  CHECK(tight.err.find("--allow optimizer-state would make it fit") != std::string::npos);
  auto allowed = run_cli(
      {"plan", "--profile", kProfile, "--out", dir + "/r.json", "--memory-budget", "30", "--allow", "optimizer-state"});
  INFO(allowed.err);
  REQUIRE(allowed.code == 0);
  CHECK(allowed.err.find("plan: optimizer state auto -> int8-blockwise (allowed by --allow optimizer-state)") !=
        std::string::npos);
  auto frozen =
      run_cli({"plan", "--profile", kProfile, "--out", dir + "/f.json", "--memory-budget", "30", "--allow", "freeze"});
  INFO(frozen.err);
  REQUIRE(frozen.code == 0);
  CHECK(frozen.err.find("plan: freeze ") != std::string::npos);
  CHECK_FALSE(vlatune::formats::read_recipe(dir + "/f.json").freeze.presets.empty());
  const auto recipe = vlatune::formats::read_recipe(dir + "/r.json");
  CHECK(recipe.optimizer.state_dtype == vlatune::formats::StateDtype::kInt8Blockwise);
  CHECK(recipe.batch.micro_batch * recipe.batch.grad_accum == 32);
  CHECK(recipe.rationale.at(0).decision == "optimizer state auto -> int8-blockwise");
  auto a100 = run_cli({"plan", "--profile", kProfile, "--explain", "--gpu", "A100-80GB", "--fp8", "auto"});
  REQUIRE(a100.code == 0);
  CHECK(a100.out.find("memory budget 70.8 GiB") != std::string::npos);
  CHECK(a100.out.find("A100-80GB has compute capability 8.0") != std::string::npos);
  CHECK(a100.out.find("fp8 0 patterns") != std::string::npos);
}

TEST_CASE("vlatune plan refuses an inference profile (4), naming the file and the field", "[cli][plan]") {
  const std::string dir = temp_dir();
  vlatune::formats::Profile p = vlatune::formats::read_profile(kProfile);
  p.settings.workload = "inference";
  vlatune::formats::write_profile(p, dir + "/profile.json");
  auto r = run_cli({"plan", "--profile", dir, "--out", dir + "/r.json"});
  CHECK(r.code == vlatune::cli::kExitBadInput);
  CHECK(r.err.find(dir + "/profile.json: $.settings.workload: \"inference\": plan needs a training profile") !=
        std::string::npos);
}
