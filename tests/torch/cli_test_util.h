// Drives the `vlatune` command line in-process for the CLI tests: run_cli({"plan", "--profile", ...}) returns the
// exit code and what the verb wrote; temp_dir() makes a fresh directory under /tmp.
#pragma once

#include <catch2/catch.hpp>

#include "temp_dir.h"

#include <stdlib.h>

#include <sstream>
#include <string>
#include <vector>

#include "cli/cli.h"

namespace vlatune::test {

struct CliResult {
  int code;
  std::string out, err;
};

inline CliResult run_cli(std::vector<std::string> args) {
  args.insert(args.begin(), "vlatune");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  std::ostringstream out, err;
  const int code = vlatune::cli::run(static_cast<int>(argv.size()), argv.data(), out, err);
  return {code, out.str(), err.str()};
}

inline std::string temp_dir(const std::string& tag = "cli") {
  return make_temp_dir(tag);
}

}  // namespace vlatune::test
