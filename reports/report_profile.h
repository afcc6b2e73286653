// The profile.json sections of `vlatune report` (reports/report.h): step time by module stacked by phase,
// hot spots, recompute ms/GiB per candidate, FP8 speedup per Linear, memory by phase; the summary shows the data
// wait per step beside the step time and calls the step input-bound when the wait is a large share of it.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "formats/profile.h"
#include "reports/html.h"

namespace vlatune::reports {

// One bar of "step time by module": a module (inclusive times) or the part of an expanded parent's time that no
// child accounts for (`rest` = true, label "<fqn> [rest]").
struct ModuleBar {
  std::string label;
  double forward_ms = 0, backward_ms = 0, recompute_ms = 0, other_ms = 0;  // other: optimizer, pseudo-modules
  bool rest = false;
  double total() const { return forward_ms + backward_ms + recompute_ms + other_ms; }
};

// The modules to draw, at most `max_bars`: starting from the roots of the FQN tree (a module's parent is the
// longest dotted prefix that is itself a row), the bar with the largest time is replaced by its children (plus a
// [rest] bar when the children leave more than 0.5% of the step unaccounted) as long as the count stays within
// max_bars. The bars partition the attributed time; they come in the profile's module order.
std::vector<ModuleBar> module_bars(const formats::BatchProfile& batch, size_t max_bars);
inline constexpr size_t kMaxModuleBars = 32;

// The hot-spot rows: modules grouped by FQN with layer indices replaced by '*' (formats::fold_indices), exclusive and
// per-phase times, kernels and activation bytes summed over the group; largest self_ms first.
struct HotSpot {
  std::string pattern, kind;
  size_t count = 0;       // modules in the group
  size_t recomputed = 0;  // of which recomputed
  double self_ms = 0, forward_ms = 0, backward_ms = 0, recompute_ms = 0;
  int64_t kernels = 0, activation_bytes = 0;
};
std::vector<HotSpot> hot_spots(const formats::BatchProfile& batch);

// GEMMs grouped by name with layer indices replaced by '*' (18 layers' q_proj are one class).
struct GemmClass {
  std::string pattern;
  size_t count = 0;     // GEMMs in the class
  size_t with_fp8 = 0;  // of which FP8 was measured
  double bf16_ms = 0;   // forward + grad_input + grad_weight, summed over the class (FP8-measured members only
                        // when with_fp8 > 0, so the speedup compares like with like)
  double fp8_ms = 0;    // the same GEMMs in FP8, plus their quantization cost
  double speedup() const { return fp8_ms > 0 ? bf16_ms / fp8_ms : 0; }
};
std::vector<GemmClass> gemm_classes(const std::vector<formats::GemmEntry>& gemms);

// A step waiting for its batch longer than this share of the step is input-bound: the loader, not the model,
// sets the pace, and more loader workers (not a faster recipe) speed it up.
inline constexpr double kInputBoundShare = 0.05;
// data_wait_ms / step_ms of a batch; nullopt when the profile did not measure the wait (written before it).
std::optional<double> data_wait_share(const formats::BatchProfile& batch);

void add_profile_sections(HtmlPage& page, const formats::Profile& profile, const std::string& file);

}  // namespace vlatune::reports
