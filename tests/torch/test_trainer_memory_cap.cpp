// `vlatune train --max-memory GiB`: refused when not a finite positive number, accepted without effect on the CPU,
// and an out-of-memory failure that names the cap, the recipe's predicted peak and its planned budget; on the GPU
// ([.gpu]) the cap makes a run that needs more fail with that message.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <limits>
#include <sstream>
#include <string>

#ifdef VLATUNE_HAVE_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include "cli/cli.h"
#include "cli_test_util.h"
#include "formats/recipe.h"
#include "trainer/memory_cap.h"
#include "trainer/train_loop.h"

using vlatune::test::run_cli;
using vlatune::test::temp_dir;

namespace {

std::vector<std::string> tiny_train(const std::string& out, const std::string& device) {
  return {"train", "--config",      "tiny",     "--device", device, "--data",    "synthetic", "--batch",
          "2",     "--steps",       "1",        "--out",    out,    "--workers", "1",         "--timing-warmup",
          "0",     "--no-progress", "--no-save"};
}

}  // namespace

TEST_CASE("--max-memory refuses values that are not a finite number of GiB > 0", "[cli][train][memory]") {
  const std::string dir = temp_dir("maxmem");
  for (const char* bad : {"nan", "inf", "-1", "0", "abc"}) {
    INFO(bad);
    auto args = tiny_train(dir + "/run-" + bad, "cpu");
    args.insert(args.end(), {"--max-memory", bad});
    const auto r = run_cli(args);
    CHECK(r.code == vlatune::cli::kExitBadInput);
    CHECK(r.err.find("--max-memory") != std::string::npos);
  }
  std::ostringstream log;
  CHECK_THROWS_AS(vlatune::trainer::apply_memory_cap(torch::kCPU, std::numeric_limits<double>::quiet_NaN(), log),
                  vlatune::trainer::TrainInputError);
  CHECK_THROWS_AS(vlatune::trainer::apply_memory_cap(torch::kCPU, -2.0, log), vlatune::trainer::TrainInputError);
}

TEST_CASE("--max-memory is accepted on the CPU and says it has no effect there", "[cli][train][memory]") {
  const std::string dir = temp_dir("maxmem");
  auto args = tiny_train(dir + "/run", "cpu");
  args.insert(args.end(), {"--max-memory", "22"});
  const auto r = run_cli(args);
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("--max-memory 22.0 GiB: no effect on the CPU") != std::string::npos);
}

TEST_CASE("--max-memory may be given with --resume: it caps this device, not the run", "[cli][train][memory]") {
  const std::string dir = temp_dir("maxmem");
  auto args = tiny_train(dir + "/run", "cpu");
  args.pop_back();  // --no-save: the resume needs the run's checkpoint
  REQUIRE(run_cli(args).code == 0);
  const auto r = run_cli({"train", "--resume", dir + "/run", "--steps", "2", "--no-progress", "--max-memory", "22"});
  INFO(r.err);
  CHECK(r.code == 0);
  CHECK(r.out.find("--max-memory 22.0 GiB: no effect on the CPU") != std::string::npos);
}

TEST_CASE("An out-of-memory failure names the cap, the predicted peak and the planned budget", "[train][memory]") {
  vlatune::formats::Recipe planned;
  planned.predicted.peak_gib = 21.34;
  planned.tuned_on.gpu = "NVIDIA H200";
  planned.rationale = {{"memory budget 22.0 GiB", "--memory-budget", {{"budget_gib", 22.0}}}};
  const std::string msg =
      vlatune::trainer::out_of_memory_message("in the first step", 4, 8, 22.0, planned, "plan.json",
                                              "CUDA out of memory. Tried to allocate 2.00 GiB.\nmore allocator detail");
  CHECK(msg.find("in the first step at micro-batch 4 x grad_accum 8 under --max-memory 22.0 GiB") != std::string::npos);
  CHECK(msg.find("plan.json predicted a peak of 21.3 GiB within a budget of 22.0 GiB (planned on NVIDIA H200)") !=
        std::string::npos);
  CHECK(msg.find("vlatune plan --memory-budget 22.0") != std::string::npos);
  CHECK(msg.find("(allocator: CUDA out of memory. Tried to allocate 2.00 GiB.)") != std::string::npos);
  CHECK(msg.find("more allocator detail") == std::string::npos);

  const std::string bare = vlatune::trainer::out_of_memory_message("in the first step", 2, 1, std::nullopt,
                                                                   vlatune::formats::Recipe{}, "<default recipe>", "");
  CHECK(bare.find("<default recipe> has no predicted peak") != std::string::npos);
  CHECK(bare.find("--max-memory") == std::string::npos);
}

TEST_CASE("Under --max-memory below what the run needs, training fails with the planner's numbers",
          "[.gpu][train][memory]") {
  REQUIRE(torch::cuda::is_available());
#ifdef VLATUNE_HAVE_CUDA
  // The cap stays with the process: the GPU tests after this one get the whole GPU back.
  struct Uncap {
    ~Uncap() { c10::cuda::CUDACachingAllocator::setMemoryFraction(1.0, 0); }
  } uncap;
#endif
  const std::string dir = temp_dir("maxmem");
  auto args = tiny_train(dir + "/run", "cuda");
  args.insert(args.end(), {"--max-memory", "0.002"});
  const auto r = run_cli(args);
  INFO(r.out << r.err);
  CHECK(r.code == 1);
  CHECK(r.err.find("out of GPU memory") != std::string::npos);
  CHECK(r.err.find("under --max-memory 0.002 GiB") != std::string::npos);
  // Within the cap: the run trains, and the cap is in the log.
  args = tiny_train(dir + "/run-ok", "cuda");
  args.insert(args.end(), {"--max-memory", "4"});
  const auto ok = run_cli(args);
  INFO(ok.err);
  CHECK(ok.code == 0);
  CHECK(ok.out.find("memory cap: 4.0 GiB") != std::string::npos);
  // Above the GPU's memory: refused.
  args = tiny_train(dir + "/run-big", "cuda");
  args.insert(args.end(), {"--max-memory", "100000"});
  CHECK(run_cli(args).code == vlatune::cli::kExitBadInput);
}
