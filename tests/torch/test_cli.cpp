// The `vlatune` command line, driven in-process: flags are validated with messages that name the flag or the
// value, verbs that do not exist yet say so with their own exit code, and the model verbs work end to end.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "cli/cli.h"
#include "cli_test_util.h"
#include "model/safetensors_io.h"

namespace {

using vlatune::test::CliResult;
using vlatune::test::run_cli;

std::string temp_dir() {
  return vlatune::test::temp_dir("cli");
}

}  // namespace

TEST_CASE("vlatune --help lists every verb", "[cli]") {
  auto r = run_cli({"--help"});
  CHECK(r.code == 0);
  for (const char* verb : {"profile", "plan", "train", "check", "report", "data", "forward", "model", "launch"}) {
    INFO(verb);
    CHECK(r.out.find(std::string("  ") + verb) != std::string::npos);
  }
  auto sub = run_cli({"train", "--help"});
  CHECK(sub.code == 0);
  CHECK(sub.out.find("--recipe") != std::string::npos);
}

TEST_CASE("vlatune --version names vlatune, LibTorch, CUDA support and the GPU", "[cli]") {
  auto r = run_cli({"--version"});
  CHECK(r.code == 0);
  CHECK(r.out.find("vlatune ") == 0);
  CHECK(r.out.find("LibTorch 2.11") != std::string::npos);
  CHECK(r.out.find("CUDA support: ") != std::string::npos);
  CHECK(r.out.find("CUPTI") != std::string::npos);
  CHECK(r.out.find("NCCL") != std::string::npos);
  CHECK(r.out.find("GPU: ") != std::string::npos);
}

TEST_CASE("Bad flags and values are rejected with exit code 4 and a message naming them", "[cli]") {
  auto unknown = run_cli({"train", "--batchsize", "3"});
  CHECK(unknown.code == vlatune::cli::kExitBadInput);
  CHECK(unknown.err.find("--batchsize") != std::string::npos);

  auto range = run_cli({"train", "--batch", "0", "--steps", "1", "--out", "/tmp/x"});
  CHECK(range.code == vlatune::cli::kExitBadInput);
  CHECK(range.err.find("--batch") != std::string::npos);
  CHECK(range.err.find("0") != std::string::npos);

  auto member = run_cli({"forward", "--config", "huge", "--batch", "/nonexistent"});
  CHECK(member.code == vlatune::cli::kExitBadInput);
  CHECK(member.err.find("huge") != std::string::npos);

  auto missing = run_cli({"forward", "--config", "tiny", "--batch", "/nonexistent/batch.safetensors"});
  CHECK(missing.code == vlatune::cli::kExitBadInput);
  CHECK(missing.err.find("/nonexistent/batch.safetensors") != std::string::npos);

  auto no_verb = run_cli({});
  CHECK(no_verb.code == vlatune::cli::kExitBadInput);
}

TEST_CASE("launch checks its command before starting any process, with a one-line message", "[cli]") {
  // (Launching itself is covered by tests/torch/test_distributed.cpp, through the built binary.)
  auto r = run_cli({"launch", "--nproc", "2", "--", "launch", "--nproc", "2", "--", "train"});
  CHECK(r.code == vlatune::cli::kExitBadInput);
  CHECK(r.err.find("cannot be launch itself") != std::string::npos);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
}

TEST_CASE("model init, model batch and forward work end to end on the tiny config", "[cli][model]") {
  const std::string dir = temp_dir();
  auto init =
      run_cli({"model", "init", "--config", "tiny", "--device", "cpu", "--seed", "3", "--out", dir + "/w.safetensors"});
  REQUIRE(init.code == 0);
  CHECK(init.out.find("\"parameters\"") != std::string::npos);
  auto batch = run_cli({"model", "batch", "--config", "tiny", "--batch", "2", "--prompt-len", "5:20", "--text-len",
                        "32", "--horizon", "6", "--out", dir + "/b.safetensors"});
  REQUIRE(batch.code == 0);
  auto fwd = run_cli({"forward", "--config", "tiny", "--device", "cpu", "--weights", dir + "/w.safetensors", "--batch",
                      dir + "/b.safetensors", "--out", dir + "/o.safetensors"});
  REQUIRE(fwd.code == 0);
  CHECK(fwd.out.find("{\"loss\": ") == 0);
  auto out = vlatune::model::SafetensorsFile::open(dir + "/o.safetensors");
  CHECK(out.tensor("velocity").sizes() == torch::IntArrayRef({2, 6, 32}));
  CHECK(out.contains("grad.action_out_proj.weight"));
  CHECK(out.contains("grad.paligemma_with_expert.paligemma.model.language_model.layers.1.mlp.down_proj.weight"));
  // The loss printed equals the loss written.
  const double printed = std::stod(fwd.out.substr(fwd.out.find(':') + 1));
  CHECK(printed == Approx(out.tensor("loss").item<double>()).epsilon(1e-6));
  // The same forward without the exact shortcuts gives the same loss (to fp32 rounding).
  auto plain = run_cli({"forward", "--config", "tiny", "--device", "cpu", "--weights", dir + "/w.safetensors",
                        "--batch", dir + "/b.safetensors", "--no-prune", "--no-trim", "--no-skip-dead"});
  REQUIRE(plain.code == 0);
  CHECK(std::stod(plain.out.substr(plain.out.find(':') + 1)) == Approx(printed).epsilon(1e-5));
  // A file that is not a Pi0.5 checkpoint is refused naming the file and what is missing.
  auto wrong = run_cli({"forward", "--config", "tiny", "--device", "cpu", "--weights", dir + "/b.safetensors",
                        "--batch", dir + "/b.safetensors"});
  CHECK(wrong.code == vlatune::cli::kExitBadInput);
  CHECK(wrong.err.find("b.safetensors") != std::string::npos);
  CHECK(wrong.err.find("missing") != std::string::npos);
}

TEST_CASE("train --no-save writes run.json and metrics but no checkpoint or weights", "[cli][train]") {
  const std::string dir = temp_dir();
  auto r =
      run_cli({"train", "--config", "tiny", "--device", "cpu", "--data", "synthetic", "--batch", "2", "--steps", "2",
               "--timing-warmup", "0", "--workers", "1", "--out", dir + "/run", "--no-progress", "--no-save"});
  REQUIRE(r.code == 0);
  CHECK(::access((dir + "/run/run.json").c_str(), F_OK) == 0);
  CHECK(::access((dir + "/run/metrics.jsonl").c_str(), F_OK) == 0);
  CHECK(::access((dir + "/run/final/model.safetensors").c_str(), F_OK) != 0);
  CHECK(::access((dir + "/run/checkpoints").c_str(), F_OK) != 0);
}
