// `vlatune plan`: profile.json -> recipe.json (recompute set, FP8 set, groups, micro-batch), explained.
// Parses and wires only: the decisions live in tuner/planner.h, the grid files in tuner/grid.h.
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "cli/cli.h"
#include "cli/validators.h"
#include "formats/json_error.h"
#include "formats/profile.h"
#include "formats/recipe.h"
#include "tuner/allowed_changes.h"
#include "tuner/gpus.h"
#include "tuner/grid.h"
#include "tuner/planner.h"

namespace vlatune::cli {

namespace {

// This machine's main memory in GiB (the budget's base for a CPU profile), or nothing when the OS does not say.
std::optional<double> host_memory_gib() {
  const long pages = sysconf(_SC_PHYS_PAGES), page_bytes = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_bytes <= 0) return std::nullopt;
  return static_cast<double>(pages) * static_cast<double>(page_bytes) / (1024.0 * 1024.0 * 1024.0);
}

struct PlanCliOptions {
  tuner::PlanOptions plan;
  std::string profile, out, batch = "auto", fp8 = "off", optimizer_state, grid_dir, compare_grid, gpu;
  std::vector<std::string> allow;
  double memory_budget_gib = 0, allreduce_gbps = 0;
  int64_t global_batch = 0;
  int grid = 0;
  bool explain = false, list_gpus = false;
};

int run_plan(PlanCliOptions& o, CLI::App& cmd, Context& ctx) {
  try {
    if (!o.compare_grid.empty()) {
      ctx.out << tuner::compare_grid(o.compare_grid).text;
      return kExitOk;
    }
    if (o.list_gpus) {
      ctx.out << tuner::format_gpu_table();
      return kExitOk;
    }
    if (o.profile.empty()) throw BadInput("plan: --profile is required");
    if (o.out.empty() && !o.explain)
      throw BadInput("plan: --out is required (or --explain, to print the plan without writing a recipe)");
    if (o.grid > 0 && o.grid_dir.empty()) throw BadInput("--grid: needs --grid-dir DIR for the candidate recipes");
    const std::string path = formats::profile_file(o.profile);
    if (!o.out.empty()) require_distinct_output("--out", o.out, {{"--profile", path}});
    tuner::PlanOptions p = o.plan;
    if (cmd.count("--memory-budget")) p.memory_budget_gib = o.memory_budget_gib;
    if (cmd.count("--allreduce-gbps")) p.allreduce_gbps = o.allreduce_gbps;
    if (cmd.count("--global-batch")) p.global_batch = o.global_batch;
    if (cmd.count("--gpu")) p.gpu = o.gpu;
    for (const std::string& list : o.allow) {
      const std::set<tuner::AllowedChange> changes = tuner::parse_allowed_changes(list);
      p.allow.insert(changes.begin(), changes.end());
    }
    if (o.batch != "auto") {
      try {
        size_t used = 0;
        p.batch = std::stoll(o.batch, &used);
        if (used != o.batch.size() || p.batch < 1) throw std::invalid_argument(o.batch);
      } catch (const std::exception&) {
        throw BadInput("--batch: expected a positive integer or 'auto', got '" + o.batch + "'");
      }
    }
    p.fp8_auto = o.fp8 == "auto";
    if (!o.optimizer_state.empty())
      p.optimizer_state =
          o.optimizer_state == "int8-blockwise" ? formats::StateDtype::kInt8Blockwise : formats::StateDtype::kAuto;
    p.profile_label = path;
    p.candidates = std::max(1, o.grid);
    p.host_memory_gib = host_memory_gib();

    const formats::Profile profile = formats::read_profile(path);
    const tuner::PlanResult result = tuner::plan(profile, path, p);
    for (const std::string& warning : result.warnings) ctx.err << "plan: warning: " << warning << "\n";
    if (!o.out.empty()) formats::write_recipe(result.recipe, o.out);
    if (o.explain) ctx.out << tuner::format_explain(result);
    if (!o.out.empty())
      ctx.out << "recipe: " << o.out << " (predicted " << result.predicted.step_ms << " ms, "
              << result.predicted.peak_gib << " GiB, " << result.predicted.samples_per_s << " samples/s"
              << (result.timed_on ? " on " + *result.timed_on : "") << ")\n";
    // The plan changes the training only as --allow permits; say so where it cannot be missed.
    for (size_t i = 0; i < result.used.size(); ++i) {
      const formats::Rationale& why = result.recipe.rationale.at(i);
      ctx.err << "plan: " << why.decision << " (" << why.reason.substr(0, why.reason.find(';')) << ")\n";
    }
    if (o.grid > 0) {
      const std::vector<std::string> paths = tuner::write_grid(result, o.grid_dir);
      for (size_t i = 0; i < paths.size(); ++i)
        ctx.out << "grid candidate " << i << ": " << paths[i] << "  " << result.candidates[i].summary << "\n";
      ctx.out << "measure them on the GPU: bash scripts/plan-grid.sh " << o.grid_dir << "\n";
    }
    return kExitOk;
  } catch (const formats::FormatError& e) {
    throw BadInput(e.what());
  } catch (const tuner::PlanInputError& e) {
    throw BadInput(e.what());
  }
}

}  // namespace

void setup_plan(CLI::App& app, Context& ctx) {
  auto o = std::make_shared<PlanCliOptions>();
  auto* cmd = app.add_subcommand("plan",
                                 "Choose recompute modules, FP8 Linears, groups and micro-batch from a "
                                 "profile -> recipe.json");
  cmd->option_defaults()->always_capture_default();
  cmd->add_option("--profile", o->profile,
                  "profile.json written by `vlatune profile`, or its directory (required unless --compare-grid)")
      ->check(file_or_directory());
  cmd->add_option("--out", o->out, "recipe.json to write (required unless --compare-grid or --explain)");
  cmd->add_option("--memory-budget", o->memory_budget_gib,
                  "GiB (default: profiled GPU memory - 5%; a CPU profile: this machine's memory - 5%)")
      ->default_str("")
      ->check(finite_positive());
  cmd->add_option("--batch", o->batch,
                  "Micro-batch: a number dividing the global batch per GPU, or 'auto' (chosen with the recompute set)");
  cmd->add_option("--global-batch", o->global_batch,
                  "Samples per optimizer step over all GPUs, kept by the plan (micro-batch x grad_accum x world size)")
      ->default_str("the profiled recipe's")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  std::string allow_help = "What the plan may change about the training (comma-separated; default: nothing):";
  for (const tuner::AllowedChangeInfo& info : tuner::allowed_change_table())
    allow_help += " " + info.name + ": " + info.help + ";";
  allow_help.back() = '.';
  cmd->add_option("--allow", o->allow, allow_help)->default_str("");
  std::string gpu_help = "Plan for this GPU's memory and features from a profile made on another (";
  for (const tuner::GpuSpec& g : tuner::known_gpus())
    gpu_help += (&g == &tuner::known_gpus().front() ? "" : ", ") + g.name;
  gpu_help += "; --list-gpus: their memory and compute capability)";
  cmd->add_option("--gpu", o->gpu, gpu_help)->default_str("the profiled GPU");
  cmd->add_flag("--list-gpus", o->list_gpus, "Print the GPUs --gpu knows and exit");
  cmd->add_option("--fp8", o->fp8,
                  "FP8 Linears: off (plans stay bf16 unless asked) or auto (measured winners, delayed scaling)")
      ->check(CLI::IsMember({"off", "auto"}));
  cmd->add_option("--optimizer-state", o->optimizer_state,
                  "AdamW moments: auto (the precision's dtype) or int8-blockwise (8-bit, 2.06 B per parameter); "
                  "default: the profiled recipe's")
      ->check(CLI::IsMember({"auto", "int8-blockwise"}));
  cmd->add_option("--fp8-include", o->plan.fp8_include,
                  "Pattern: consider these Linears for FP8 despite the default exclusions (repeatable; default none)")
      ->default_str("");
  cmd->add_option("--fp8-exclude", o->plan.fp8_exclude,
                  "Pattern: keep these Linears in bf16 (repeatable; default none)")
      ->default_str("");
  cmd->add_option("--fp8-margin", o->plan.fp8_margin, "Required bf16/FP8 time ratio")->check(finite_range(1.0, 100.0));
  cmd->add_option("--recompute-candidate", o->plan.recompute_candidates,
                  "Pattern: also consider recomputing these modules (repeatable; default none)")
      ->default_str("");
  cmd->add_option("--world-size", o->plan.world_size, "Data-parallel GPUs")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--allreduce-gbps", o->allreduce_gbps,
                  "All-reduce bus bandwidth in GB/s (default: the profile's communication section)")
      ->default_str("")
      ->check(finite_positive());
  cmd->add_flag("--explain", o->explain, "Print every decision with the figures behind it (without --out: only that)");
  cmd->add_option("--grid", o->grid,
                  "Also write the plan and the next N-1 best candidates to --grid-dir (default: off)")
      ->default_str("")
      ->check(CLI::Range(1, 100));
  cmd->add_option("--grid-dir", o->grid_dir,
                  "Directory for candidate_<i>.json, measured by scripts/plan-grid.sh (required with --grid)");
  cmd->add_option("--compare-grid", o->compare_grid,
                  "Summarize a measured grid: DIR/candidate_<i>.json vs DIR/run_<i>/run.json (default: off)")
      ->check(CLI::ExistingDirectory);
  cmd->callback([&ctx, o, cmd] { ctx.action = [&ctx, o, cmd] { return run_plan(*o, *cmd, ctx); }; });
}

}  // namespace vlatune::cli
