// The `vlatune` command line, driven in-process: flags are validated with messages that name the flag or the
// value, verbs that do not exist yet say so with their own exit code, and the model verbs work end to end.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <iterator>
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

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
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
  // (Launching itself is covered by tests/torch/test_trainer_distributed.cpp, through the built binary.)
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

TEST_CASE("--help of every verb shows the default of each option that has one", "[cli]") {
  std::ostringstream out, err;
  vlatune::cli::Context ctx{out, err, {}};
  CLI::App app{"vlatune"};
  vlatune::cli::setup_verbs(app, ctx);
  // train and profile: their own rules (cli/cmd_train.cpp, cli/cmd_profile.cpp).
  std::vector<CLI::App*> verbs;
  for (CLI::App* verb : app.get_subcommands({})) {
    if (verb->get_name() == "train" || verb->get_name() == "profile") continue;
    const auto subs = verb->get_subcommands({});
    if (subs.empty()) verbs.push_back(verb);
    verbs.insert(verbs.end(), subs.begin(), subs.end());
  }
  CHECK(verbs.size() >= 10);
  for (CLI::App* verb : verbs) {
    for (const CLI::Option* opt : verb->get_options()) {
      // Flags (no value) are off unless given; required options have no default.
      if (opt->get_name() == "--help" || opt->get_items_expected_max() == 0 || opt->get_required()) continue;
      std::string description = opt->get_description();
      std::transform(description.begin(), description.end(), description.begin(), ::tolower);
      INFO(verb->get_name() << " " << opt->get_name() << ": " << opt->get_description());
      CHECK((!opt->get_default_str().empty() || description.find("default") != std::string::npos ||
             description.find("required") != std::string::npos));
    }
  }
  auto help = run_cli({"check", "--help"});
  CHECK(help.out.find("=0.05") != std::string::npos);  // --alpha
  CHECK(help.out.find("=3") != std::string::npos);     // --threshold
}

TEST_CASE("Numeric flags refuse NaN, infinities, negative seeds and reversed ranges (exit 4, naming the flag)",
          "[cli]") {
  const std::string dir = temp_dir();
  REQUIRE(run_cli({"model", "batch", "--batch", "1", "--text-len", "32", "--prompt-len", "5:20", "--horizon", "6",
                   "--out", dir + "/batch.safetensors"})
              .code == 0);
  struct Case {
    std::vector<std::string> args;
    std::string named;
  };
  const std::vector<Case> cases = {
      {{"launch", "--grace", "nan", "--", "train"}, "--grace"},
      {{"plan", "--profile", dir, "--out", dir + "/r.json", "--memory-budget", "nan"}, "--memory-budget"},
      {{"plan", "--profile", dir, "--out", dir + "/r.json", "--allreduce-gbps", "inf"}, "--allreduce-gbps"},
      {{"plan", "--profile", dir, "--out", dir + "/r.json", "--fp8-margin", "nan"}, "--fp8-margin"},
      {{"model", "init", "--seed", "-1", "--out", dir + "/w.safetensors"}, "--seed"},
      {{"model", "batch", "--seed", "-1", "--out", dir + "/b.safetensors"}, "--seed"},
      {{"forward", "--seed", "-1", "--batch", dir + "/batch.safetensors"}, "--seed"},
      {{"data", "synth", "--samples", "2", "--seed", "-1", "--out", dir + "/ds"}, "--seed"},
      {{"data", "synth", "--samples", "2", "--prompt-len", "5:3", "--out", dir + "/ds"}, "MIN <= MAX"},
      {{"model", "batch", "--prompt-len", "5:3", "--out", dir + "/b.safetensors"}, "MIN <= MAX"},
  };
  for (const auto& c : cases) {
    INFO(c.args[0] << " " << c.args[1] << " ... expecting " << c.named);
    auto r = run_cli(c.args);
    CHECK(r.code == vlatune::cli::kExitBadInput);
    CHECK(r.err.find(c.named) != std::string::npos);
  }
  CHECK(::access((dir + "/ds").c_str(), F_OK) != 0);
  CHECK(::access((dir + "/b.safetensors").c_str(), F_OK) != 0);
}

TEST_CASE("forward refuses non-finite weights, images and time, an empty batch and a FIFO; never prints nan",
          "[cli][model]") {
  const std::string dir = temp_dir();
  REQUIRE(run_cli({"model", "init", "--device", "cpu", "--out", dir + "/w.safetensors"}).code == 0);
  REQUIRE(run_cli({"model", "batch", "--batch", "2", "--prompt-len", "5:20", "--text-len", "32", "--horizon", "6",
                   "--out", dir + "/b.safetensors"})
              .code == 0);
  auto forward = [&](const std::string& weights, const std::string& batch) {
    return run_cli({"forward", "--device", "cpu", "--weights", weights, "--batch", batch});
  };
  const auto w = vlatune::model::SafetensorsFile::open(dir + "/w.safetensors");
  const auto b = vlatune::model::SafetensorsFile::open(dir + "/b.safetensors");
  auto rewrite = [](const vlatune::model::SafetensorsFile& f, const std::string& name, torch::Tensor value,
                    const std::string& path) {
    std::vector<std::pair<std::string, torch::Tensor>> tensors;
    for (const auto& e : f.entries()) tensors.emplace_back(e.name, e.name == name ? value : f.tensor(e.name));
    vlatune::model::write_safetensors(path, tensors, f.metadata());
  };
  const std::string weight = "action_out_proj.weight";
  auto bad_weight = w.tensor(weight);
  bad_weight[0][0] = NAN;
  rewrite(w, weight, bad_weight, dir + "/nan_w.safetensors");
  auto r = forward(dir + "/nan_w.safetensors", dir + "/b.safetensors");
  CHECK(r.code == vlatune::cli::kExitBadInput);
  CHECK(r.err.find("'" + weight + "' has 1 non-finite value") != std::string::npos);
  CHECK(r.out.empty());

  auto images = b.tensor("images");
  images[1][0][0][3][3] = INFINITY;
  rewrite(b, "images", images, dir + "/inf_images.safetensors");
  r = forward(dir + "/w.safetensors", dir + "/inf_images.safetensors");
  CHECK(r.code == vlatune::cli::kExitBadInput);
  CHECK(r.err.find("'images' has 1 non-finite value") != std::string::npos);

  rewrite(b, "time", torch::tensor({0.5f, NAN}), dir + "/nan_time.safetensors");
  r = forward(dir + "/w.safetensors", dir + "/nan_time.safetensors");
  CHECK(r.code == vlatune::cli::kExitBadInput);
  CHECK(r.err.find("'time' has 1 non-finite value") != std::string::npos);
  CHECK(r.out.find("nan") == std::string::npos);

  std::vector<std::pair<std::string, torch::Tensor>> empty;
  for (const auto& e : b.entries()) empty.emplace_back(e.name, b.tensor(e.name).narrow(0, 0, 0));
  vlatune::model::write_safetensors(dir + "/empty.safetensors", empty);
  r = forward(dir + "/w.safetensors", dir + "/empty.safetensors");
  CHECK(r.code == vlatune::cli::kExitBadInput);
  CHECK(r.err.find("empty batch") != std::string::npos);

  REQUIRE(::mkfifo((dir + "/fifo.safetensors").c_str(), 0600) == 0);
  for (const auto& args : {std::vector<std::string>{dir + "/w.safetensors", dir + "/fifo.safetensors"},
                           std::vector<std::string>{dir + "/fifo.safetensors", dir + "/b.safetensors"}}) {
    r = forward(args[0], args[1]);  // would block forever on open before
    CHECK(r.code == vlatune::cli::kExitBadInput);
    CHECK(r.err.find("not a regular file") != std::string::npos);
  }
  r = forward(dir + "/w.safetensors", "/dev/zero");
  CHECK(r.code == vlatune::cli::kExitBadInput);

  // --out over an input is refused before anything runs.
  const std::string before = read_bytes(dir + "/w.safetensors");
  r = run_cli({"forward", "--device", "cpu", "--weights", dir + "/w.safetensors", "--batch", dir + "/b.safetensors",
               "--out", dir + "/./w.safetensors"});
  CHECK(r.code == vlatune::cli::kExitBadInput);
  CHECK(r.err.find("same file as --weights") != std::string::npos);
  CHECK(read_bytes(dir + "/w.safetensors") == before);
}

TEST_CASE("Loading weights counts what matched and names another config in one line", "[cli][model]") {
  const std::string dir = temp_dir();
  REQUIRE(run_cli({"model", "init", "--device", "cpu", "--out", dir + "/w.safetensors"}).code == 0);
  REQUIRE(run_cli({"model", "batch", "--batch", "1", "--prompt-len", "5:20", "--text-len", "32", "--horizon", "6",
                   "--out", dir + "/b.safetensors"})
              .code == 0);
  const auto w = vlatune::model::SafetensorsFile::open(dir + "/w.safetensors");
  const size_t n = w.entries().size();
  std::vector<std::pair<std::string, torch::Tensor>> most;
  for (size_t i = 1; i < n; ++i) most.emplace_back(w.entries()[i].name, w.tensor(w.entries()[i].name));
  vlatune::model::write_safetensors(dir + "/most.safetensors", most);
  auto r = run_cli(
      {"forward", "--device", "cpu", "--weights", dir + "/most.safetensors", "--batch", dir + "/b.safetensors"});
  CHECK(r.code == vlatune::cli::kExitBadInput);
  CHECK(r.err.find(std::to_string(n - 1) + " of " + std::to_string(n) + " tensors match by name and shape") !=
        std::string::npos);
  CHECK(r.err.find("1 missing: " + w.entries()[0].name) != std::string::npos);

  // The file's metadata names its config: weights of another config are refused in one line.
  std::vector<std::pair<std::string, torch::Tensor>> all;
  for (const auto& e : w.entries()) all.emplace_back(e.name, w.tensor(e.name));
  vlatune::model::write_safetensors(dir + "/full.safetensors", all, {{"vlatune.config", "full"}});
  r = run_cli(
      {"forward", "--device", "cpu", "--weights", dir + "/full.safetensors", "--batch", dir + "/b.safetensors"});
  CHECK(r.code == vlatune::cli::kExitBadInput);
  CHECK(r.err.find("weights of the 'full' config") != std::string::npos);
  CHECK(r.err.find("the model is the 'tiny' config") != std::string::npos);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
}

TEST_CASE("An output that cannot be written exits 1 naming the file, and leaves nothing behind", "[cli][model]") {
  const std::string dir = temp_dir();
  auto r = run_cli({"model", "init", "--device", "cpu", "--out", dir + "/missing/w.safetensors"});
  CHECK(r.code == vlatune::cli::kExitFailure);
  CHECK(r.err.find(dir + "/missing/w.safetensors") != std::string::npos);
  // A name of 255 bytes, the longest a file name can be, is written like any other.
  const std::string long_name = dir + "/" + std::string(255 - 12, 'w') + ".safetensors";
  REQUIRE(run_cli({"model", "batch", "--batch", "1", "--text-len", "32", "--prompt-len", "5:20", "--horizon", "6",
                   "--out", long_name})
              .code == 0);
  CHECK(vlatune::model::SafetensorsFile::open(long_name).contains("images"));
}
