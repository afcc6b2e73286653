// `vlatune train` and `vlatune profile` on the command line: every numeric flag refuses NaN, infinities and
// out-of-range values naming the flag; --help shows the defaults; --data must be written out; --config follows the
// device; --resume refuses the flags it cannot honour; `check` names the recipe keys that make two runs
// incomparable.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <sys/stat.h>

#include <string>
#include <vector>

#include "cli/cli.h"
#include "cli_test_util.h"

namespace {

using vlatune::test::run_cli;

const std::vector<std::string> kTiny = {"--config",  "tiny", "--device",        "cpu", "--batch",       "2",
                                        "--workers", "1",    "--timing-warmup", "0",   "--no-progress", "--seed",
                                        "5"};

std::vector<std::string> train_args(std::vector<std::string> extra) {
  std::vector<std::string> args = {"train"};
  args.insert(args.end(), kTiny.begin(), kTiny.end());
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

}  // namespace

TEST_CASE("train and profile refuse NaN, infinite and out-of-range numbers, naming the flag", "[cli][train]") {
  const std::string dir = vlatune::test::temp_dir("cli-train");
  const std::vector<std::vector<std::string>> bad = {
      {"--clip-norm", "nan"}, {"--ema", "nan"},        {"--lr", "inf"},           {"--lr", "2"},
      {"--decay-lr", "NaN"},  {"--weight-decay", "2"}, {"--dist-timeout", "nan"}, {"--ema", "1"},
  };
  for (const auto& flag : bad) {
    INFO(flag[0] << " " << flag[1]);
    auto r = run_cli(train_args({"--data", "synthetic", "--steps", "1", "--out", dir + "/run", flag[0], flag[1]}));
    CHECK(r.code == vlatune::cli::kExitBadInput);
    CHECK_THAT(r.err, Catch::Contains(flag[0]));
  }
  // An unsigned seed takes "-1" as 2^64 - 1 unless refused; a FIFO as the recipe would block the read.
  const std::string fifo = dir + "/recipe.fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
  const std::vector<std::vector<std::string>> bad_for_both = {
      {"--dist-timeout", "inf"}, {"--seed", "-1"}, {"--recipe", fifo}};
  for (const auto& flag : bad_for_both) {
    INFO(flag[0] << " " << flag[1]);
    auto r = run_cli(train_args({"--data", "synthetic", "--steps", "1", "--out", dir + "/run", flag[0], flag[1]}));
    CHECK(r.code == vlatune::cli::kExitBadInput);
    CHECK_THAT(r.err, Catch::Contains(flag[0]));
    auto profile = run_cli({"profile", "--data", "synthetic", "--out", dir + "/p", flag[0], flag[1]});
    CHECK(profile.code == vlatune::cli::kExitBadInput);
    CHECK_THAT(profile.err, Catch::Contains(flag[0]));
  }
}

TEST_CASE("--help of train and profile shows every default", "[cli][train]") {
  const auto train = run_cli({"train", "--help"});
  REQUIRE(train.code == 0);
  for (const char* text :
       {"5e-05", "10000", "1000000", "full on a GPU, tiny on the CPU", "the recipe's, 32", "= --lr", "600"}) {
    INFO(text);
    CHECK_THAT(train.out, Catch::Contains(text));
  }
  const auto profile = run_cli({"profile", "--help"});
  REQUIRE(profile.code == 0);
  CHECK_THAT(profile.out, Catch::Contains("full on a GPU, tiny on the CPU") && Catch::Contains("--batch / 2"));
}

TEST_CASE("--data must be written out, and --config follows the device and says so", "[cli][train]") {
  const std::string dir = vlatune::test::temp_dir("cli-train");
  auto no_data = run_cli({"train", "--device", "cpu", "--steps", "1", "--out", dir + "/none"});
  CHECK(no_data.code == vlatune::cli::kExitBadInput);
  CHECK_THAT(no_data.err, Catch::Contains("--data is required") && Catch::Contains("--data synthetic"));
  auto no_data_profile = run_cli({"profile", "--device", "cpu", "--out", dir + "/p"});
  CHECK(no_data_profile.code == vlatune::cli::kExitBadInput);
  CHECK_THAT(no_data_profile.err, Catch::Contains("--data is required"));

  auto r = run_cli({"train", "--device", "cpu", "--data", "synthetic", "--batch", "2", "--workers", "1", "--steps", "1",
                    "--timing-warmup", "0", "--no-progress", "--no-save", "--out", dir + "/auto"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("config: tiny (the default on the CPU") &&
                        Catch::Contains("vlatune train: tiny Pi0.5 on cpu"));
}

TEST_CASE("--resume refuses the flags a run cannot change, naming them all", "[cli][train]") {
  const std::string dir = vlatune::test::temp_dir("cli-train");
  auto r = run_cli({"train", "--resume", dir, "--steps", "9", "--lr", "0.1", "--seed", "3", "--precision", "bf16",
                    "--workers", "2"});
  CHECK(r.code == vlatune::cli::kExitBadInput);
  CHECK_THAT(r.err, Catch::Contains("--precision, --lr, --seed cannot change"));
}

TEST_CASE("check names the recipe keys that make two runs incomparable", "[cli][train][check]") {
  const std::string dir = vlatune::test::temp_dir("cli-train");
  auto a = run_cli(train_args({"--data", "synthetic", "--steps", "1", "--out", dir + "/bf16"}));
  REQUIRE(a.code == 0);
  // A flag over the (default) recipe makes another recipe: recorded as such, not as the bf16 one.
  auto b = run_cli(
      train_args({"--data", "synthetic", "--steps", "1", "--precision", "fp32-master", "--out", dir + "/fp32"}));
  REQUIRE(b.code == 0);
  auto c = run_cli({"check", dir + "/bf16", dir + "/fp32"});
  CHECK(c.code == 3);
  CHECK_THAT(c.out, Catch::Contains("recipe_hash") &&
                        Catch::Contains("keys that differ: model_options.precision: \"bf16\" vs \"fp32-master\""));
}
