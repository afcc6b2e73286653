#include "cli/cli.h"

#include <CLI/CLI.hpp>

#include <exception>

#include "formats/file_io.h"
#include "formats/json_error.h"

namespace vlatune::cli {

void setup_verbs(CLI::App& app, Context& ctx) {
  setup_profile(app, ctx);
  setup_plan(app, ctx);
  setup_train(app, ctx);
  setup_check(app, ctx);
  setup_report(app, ctx);
  setup_data(app, ctx);
  setup_forward(app, ctx);
  setup_model(app, ctx);
  setup_launch(app, ctx);
  setup_sample(app, ctx);
  setup_eval(app, ctx);
  setup_serve(app, ctx);
}

int run(int argc, const char* const argv[], std::ostream& out, std::ostream& err) {
  CLI::App app{
      "vlatune: measure Pi0.5 training, plan a recipe from the measurements, train with it, "
      "and gate performance regressions.",
      "vlatune"};
  app.require_subcommand(0, 1);
  bool show_version = false;
  app.add_flag("--version", show_version, "Print vlatune, LibTorch and CUDA versions and the GPU seen");

  Context ctx{out, err, {}};
  setup_verbs(app, ctx);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    out << app.help();
    return kExitOk;
  } catch (const CLI::CallForAllHelp& e) {
    out << app.help("", CLI::AppFormatMode::All);
    return kExitOk;
  } catch (const CLI::ParseError& e) {
    // Help requested on a subcommand arrives here too (CLI11 routes it through the subcommand).
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) {
      app.exit(e, out, err);
      return kExitOk;
    }
    err << "vlatune: " << e.what() << "\n";
    err << "Run with --help for more information.\n";
    return kExitBadInput;
  }

  if (show_version) {
    out << version_text();
    return kExitOk;
  }
  if (!ctx.action) {
    out << app.help();
    return kExitBadInput;
  }
  try {
    return ctx.action();
  } catch (const Unavailable& e) {
    err << "vlatune: " << e.what() << "\n";
    return kExitUnavailable;
  } catch (const BadInput& e) {
    err << "vlatune: " << e.what() << "\n";
    return kExitBadInput;
  } catch (const formats::FormatError& e) {
    // An input file that is unreadable or invalid, wherever a verb met it.
    err << "vlatune: " << e.what() << "\n";
    return kExitBadInput;
  } catch (const formats::WriteError& e) {
    // An output that could not be written (disk full, permissions): the verb failed, the input was fine.
    err << "vlatune: error: " << e.what() << "\n";
    return kExitFailure;
  } catch (const std::exception& e) {
    err << "vlatune: error: " << e.what() << "\n";
    return kExitFailure;
  }
}

}  // namespace vlatune::cli
