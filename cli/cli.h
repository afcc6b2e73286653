// The `vlatune` command line: one CLI11 app, one file per verb (cmd_<verb>.cpp), exit codes below.
#pragma once

#include <functional>
#include <ostream>
#include <stdexcept>
#include <string>

namespace CLI {
class App;
}

namespace vlatune::cli {

// Exit codes shared by every verb. `check` adds its own verdicts (1 regression, 2 numerics, 3 incomparable)
// and uses kBadInput for unreadable input, as every verb does.
enum ExitCode : int {
  kExitOk = 0,
  kExitFailure = 1,      // the verb ran and failed (message on stderr)
  kExitBadInput = 4,     // bad flag, value or input file (CLI parse errors included)
  kExitUnavailable = 69  // the capability is not built yet, or not built into this binary (EX_UNAVAILABLE)
};

// Thrown by a verb whose capability does not exist yet (or is compiled out); the message says which.
class Unavailable : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Thrown for input that is well-formed on the command line but bad (missing file, wrong shape, ...).
class BadInput : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What a verb's setup function registers: the action to run after a successful parse.
struct Context {
  std::ostream& out;
  std::ostream& err;
  std::function<int()> action;
};

// Parses argv, runs the chosen verb, maps exceptions to exit codes with a one-line message on `err`: BadInput and
// formats::FormatError 4, Unavailable 69, formats::WriteError and anything else 1.
int run(int argc, const char* const argv[], std::ostream& out, std::ostream& err);

// Registers every verb on `app` (what run() parses with; tests walk it to check every flag's help).
void setup_verbs(CLI::App& app, Context& ctx);

// The verbs (each in its own cmd_<verb>.cpp).
void setup_profile(CLI::App& app, Context& ctx);
void setup_plan(CLI::App& app, Context& ctx);
void setup_train(CLI::App& app, Context& ctx);
void setup_check(CLI::App& app, Context& ctx);
void setup_report(CLI::App& app, Context& ctx);
void setup_data(CLI::App& app, Context& ctx);
void setup_forward(CLI::App& app, Context& ctx);
void setup_model(CLI::App& app, Context& ctx);
void setup_launch(CLI::App& app, Context& ctx);
void setup_sample(CLI::App& app, Context& ctx);
void setup_eval(CLI::App& app, Context& ctx);
void setup_serve(CLI::App& app, Context& ctx);

// `vlatune --version` (environment_info.cpp: the only CLI file that asks torch and CUDA).
std::string version_text();

}  // namespace vlatune::cli
