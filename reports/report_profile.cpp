#include "reports/report_profile.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "formats/fqn_pattern.h"
#include "reports/number_format.h"
#include "reports/svg.h"

namespace vlatune::reports {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr size_t kMaxGemmRows = 400;   // the per-GEMM table (inside <details>) stops here
constexpr size_t kMaxKernelRows = 20;  // the kernel table of the module section
constexpr size_t kMaxHotSpotRows = 15;

std::string note(const std::string& text) {
  return "<p class=\"note\">" + escape_html(text) + "</p>";
}

double gib(int64_t bytes) {
  return static_cast<double>(bytes) / kGiB;
}

std::string opt_gib(const std::optional<double>& v) {
  return v ? fixed(*v, 2) : std::string("-");
}

// A module class: rows sharing an index pattern, with summed inclusive per-phase times.
struct ClassNode {
  std::string pattern;
  size_t first_row = 0;  // profile order
  size_t count = 0;
  ModuleBar sums;
  int parent = -1;
  std::vector<int> children;
};

std::string class_label(const ClassNode& n) {
  return n.count > 1 ? n.pattern + " \u00d7" + std::to_string(n.count) : n.pattern;
}

// Patterns that differ only in a layer index, as one "…layers.* \u00d7N" line each, in first-seen order.
std::vector<std::string> fold_patterns(const std::vector<std::string>& patterns) {
  std::vector<std::pair<std::string, size_t>> folded;
  std::map<std::string, size_t> index;
  for (const auto& p : patterns) {
    const std::string f = formats::fold_indices(p);
    auto [it, fresh] = index.emplace(f, folded.size());
    if (fresh) folded.push_back({f, 0});
    ++folded[it->second].second;
  }
  std::vector<std::string> out;
  for (const auto& [f, n] : folded) out.push_back(n > 1 ? f + " \u00d7" + std::to_string(n) : f);
  return out;
}

// "0.40 (0.4%)": the median data wait and its share of the step; "not measured" (unknown is not 0).
std::string data_wait_cell(const formats::BatchProfile& b) {
  const auto share = data_wait_share(b);
  return share ? fixed(*b.data_wait_ms, 2) + " (" + fixed(*share * 100, 1) + "%)" : "not measured";
}

// Above kInputBoundShare: the loader, not the model, sets the step time.
std::string input_bound_warning(double wait_ms, const std::string& pct) {
  return "<p><strong>Input-bound:</strong> " +
         escape_html("steps wait " + fixed(wait_ms, 2) + " ms for their batch (median), " + pct +
                     " of the step (more than " + fixed(kInputBoundShare * 100, 0) +
                     "%): the GPU idles while the data loader catches up. Give the loader more threads:") +
         " <code>vlatune train --workers N</code>.</p>";
}

// The data wait of the requested batch in words, and the input-bound warning when it calls for one.
std::string data_wait_note(const formats::BatchProfile& b, const std::string& data) {
  const auto share = data_wait_share(b);
  if (!share)
    return note(
        "Data wait per step: not measured (this profile was written before profile.json recorded "
        "data_wait_ms; profile again to measure it).");
  const std::string wait = fixed(*b.data_wait_ms, 2) + " ms/step", pct = fixed(*share * 100, 1) + "%";
  std::string html = note("Data wait " + wait + " (" + pct + " of the step) at micro-batch " + std::to_string(b.batch) +
                          ": the median time a timed step waited for its batch (data " + data + ").");
  return *share > kInputBoundShare ? html + input_bound_warning(*b.data_wait_ms, pct) : html;
}

std::string summary_section(const formats::Profile& p, const std::string& file) {
  const auto& e = p.environment;
  const auto& s = p.settings;
  std::vector<std::vector<std::string>> rows = {
      {"file", file},
      {"gpu",
       (e.gpu ? *e.gpu : "-") + ", driver " + (e.driver ? *e.driver : "-") + ", CUDA " + (e.cuda ? *e.cuda : "-")},
      {"software", "torch " + e.torch + ", vlatune " + (e.vlatune_commit ? *e.vlatune_commit : "-")},
      {"model", e.config + ", world size " + std::to_string(e.world_size) + ", recipe " + e.recipe_hash},
      {"measurement", "device " + s.device + ", tracer " + s.tracer + ", data " + s.data + ", " +
                          std::to_string(s.steps) + " traced steps after " + std::to_string(s.warmup) + " warm-up"},
      {"GPU memory", s.gpu_memory_gib ? fixed(*s.gpu_memory_gib, 1) + " GiB" : "-"},
  };
  if (p.overhead)
    rows.push_back({"tracer overhead", fixed(p.overhead->untraced_step_ms, 2) + " ms untraced, " +
                                           fixed(p.overhead->traced_step_ms, 2) + " ms traced (" +
                                           signed_pct(p.overhead->fraction() * 100, 1) + ")"});
  for (const auto& d : s.degraded) rows.push_back({"DEGRADED", d});
  std::string html = html_table({"", ""}, rows, 99);
  std::vector<std::vector<std::string>> batches;
  for (const auto& b : p.batches) {
    batches.push_back({std::to_string(b.batch), fixed(b.step_ms, 2), data_wait_cell(b),
                       std::to_string(b.step_ms_samples.size()), opt_gib(b.peak_gib), fixed(b.attribution.gpu_ms, 2),
                       fixed(b.attribution.attributed_fraction * 100, 1) + "%",
                       std::to_string(b.attribution.dropped_records)});
  }
  html += html_table({"micro-batch", "step (ms, median)", "data wait (ms, median; share of step)", "timed steps",
                      "peak GiB", "GPU ms/step", "attributed", "dropped records"},
                     batches, 0);
  return html + data_wait_note(p.batches.at(0), s.data);
}

std::string module_section(const formats::BatchProfile& b) {
  const std::vector<ModuleBar> bars = module_bars(b, kMaxModuleBars);
  svg::BarChart chart;
  chart.title = "Step time by module at micro-batch " + std::to_string(b.batch) + " (ms per step, by phase)";
  chart.value_label = "ms per step (inclusive of child modules; layer indices folded into *)";
  chart.components = {"forward", "backward", "recompute", "optimizer / other"};
  double sum = 0;
  for (const auto& m : bars) {
    chart.bars.push_back({m.label, {m.forward_ms, m.backward_ms, m.recompute_ms, m.other_ms}});
    sum += m.total();
  }
  std::string html = svg::bar_chart(chart);
  html += note("Bars sum to " + fixed(sum, 1) + " ms; attributed GPU time " +
               fixed(b.attribution.gpu_ms * b.attribution.attributed_fraction, 1) + " ms of " +
               fixed(b.attribution.gpu_ms, 1) + " ms; median step " + fixed(b.step_ms, 1) + " ms.");
  if (std::any_of(bars.begin(), bars.end(), [](const ModuleBar& m) { return m.rest; }))
    html += note(
        "A bar ending in [rest] is a module whose children are drawn as bars of their own: [rest] is the "
        "part of its time that none of its child modules accounts for (its own kernels between the "
        "children, such as residual adds, reshapes and casts).");

  // Hot spots: the largest exclusive times, the layers of one class folded into one row (layers.* x18).
  const std::vector<HotSpot> spots = hot_spots(b);
  std::vector<std::vector<std::string>> table;
  for (size_t i = 0; i < spots.size() && i < kMaxHotSpotRows; ++i) {
    const HotSpot& h = spots[i];
    table.push_back({h.count > 1 ? h.pattern + " \u00d7" + std::to_string(h.count) : h.pattern, h.kind,
                     fixed(h.self_ms, 3), fixed(h.forward_ms, 3), fixed(h.backward_ms, 3), fixed(h.recompute_ms, 3),
                     std::to_string(h.kernels), fixed(gib(h.activation_bytes), 3),
                     h.recomputed == 0         ? ""
                     : h.recomputed == h.count ? "yes"
                                               : std::to_string(h.recomputed) + " of " + std::to_string(h.count)});
  }
  html += "<h3>Hot spots (exclusive time)</h3>" +
          html_table({"module", "kind", "self ms", "forward ms", "backward ms", "recompute ms", "kernels",
                      "activation GiB", "recomputed"},
                     table, 2) +
          note(
              "Exclusive time: a module's own kernels, not its children's. Modules that differ only in a layer index "
              "are one row (their index is '*', \u00d7N counts them) with their times summed.");
  if (!b.kernels.empty()) {
    // The largest kernels and where they ran (profile.json's kernel sites: module with layer indices folded, phase).
    std::vector<std::vector<std::string>> kernels;
    for (size_t i = 0; i < b.kernels.size() && i < kMaxKernelRows; ++i) {
      const auto& k = b.kernels[i];
      std::string where;
      for (size_t j = 0; j < k.sites.size() && j < 3; ++j)
        where += (j ? "\n" : "") + k.sites[j].module + " (" + k.sites[j].phase + ") " + fixed(k.sites[j].ms, 3) + " ms";
      if (k.sites.empty()) where = "-";
      kernels.push_back({k.name.size() > 90 ? k.name.substr(0, 87) + "..." : k.name, k.category, where,
                         fixed(k.calls, 1), fixed(k.ms, 3)});
    }
    html += "<h3>Largest kernels and where they ran</h3>" +
            html_table({"kernel", "category", "where (largest 3)", "calls per step", "ms per step"}, kernels, 3);
  }
  return html;
}

std::string recompute_section(const formats::BatchProfile& b) {
  if (b.recompute.empty()) return note("No recompute A/B measurements in this profile.");
  svg::BarChart chart;
  chart.title = "Recompute cost per candidate at micro-batch " + std::to_string(b.batch);
  chart.value_label = "ms of step time per GiB of peak memory saved (lower is cheaper)";
  chart.components = {"ms per GiB saved"};
  std::vector<std::vector<std::string>> rows;
  for (const auto& c : b.recompute) {
    if (c.ms_per_gib_saved) chart.bars.push_back({c.name, {*c.ms_per_gib_saved}});
    std::string patterns;
    for (const auto& p : fold_patterns(c.patterns)) patterns += (patterns.empty() ? "" : "\n") + p;
    rows.push_back({c.name, patterns, c.added ? "recompute in addition" : "stop recomputing", fixed(c.step_ms_delta, 2),
                    fixed(c.peak_gib_delta, 2), c.ms_per_gib_saved ? fixed(*c.ms_per_gib_saved, 3) : "-"});
  }
  std::string html =
      chart.bars.empty() ? note("No candidate saved memory (ms per GiB undefined).") : svg::bar_chart(chart);
  html +=
      html_table({"candidate", "patterns", "change", "step ms delta", "peak GiB delta", "ms per GiB saved"}, rows, 3);
  return html;
}

std::string fp8_section(const std::vector<formats::GemmEntry>& gemms) {
  const std::vector<GemmClass> classes = gemm_classes(gemms);
  svg::BarChart chart;
  chart.title = "FP8 speedup per Linear class (bf16 time / FP8 time incl. quantization; > 1 is faster)";
  chart.value_label = "speedup over bf16 (forward + grad_input + grad_weight)";
  chart.components = {"speedup"};
  chart.reference = 1.0;
  chart.reference_label = "1.0 = no gain";
  std::vector<std::vector<std::string>> rows;
  for (const auto& c : classes) {
    if (c.with_fp8 > 0)
      chart.bars.push_back({c.pattern + (c.count > 1 ? " \u00d7" + std::to_string(c.count) : ""), {c.speedup()}});
    rows.push_back({c.pattern, std::to_string(c.count), std::to_string(c.with_fp8), fixed(c.bf16_ms, 3),
                    c.with_fp8 ? fixed(c.fp8_ms, 3) : "-", c.with_fp8 ? fixed(c.speedup(), 3) : "-"});
  }
  if (chart.bars.empty())
    return note("FP8 was not measured in this profile (CPU, or no Linear with dims divisible by 16).");
  std::string html = svg::bar_chart(chart);
  html +=
      html_table({"Linear class", "GEMMs", "FP8 measured", "bf16 ms/step", "FP8 + quant ms/step", "speedup"}, rows, 1);
  std::vector<std::vector<std::string>> all;
  for (size_t i = 0; i < gemms.size() && i < kMaxGemmRows; ++i) {
    const auto& g = gemms[i];
    const double fp8 = g.fp8 ? g.fp8->total() + g.quant_ms.value_or(0) : 0;
    all.push_back({g.name, std::to_string(g.m) + " x " + std::to_string(g.k) + " x " + std::to_string(g.n),
                   fixed(g.bf16.total(), 4), g.fp8 ? fixed(fp8, 4) : "-",
                   g.fp8 && fp8 > 0 ? fixed(g.bf16.total() / fp8, 3) : "-"});
  }
  html += "<details><summary>Every GEMM (" + std::to_string(gemms.size()) + ")</summary>" +
          html_table({"GEMM", "m x k x n", "bf16 ms", "FP8 + quant ms", "speedup"}, all, 1) + "</details>";
  return html;
}

std::string memory_section(const formats::Profile& p) {
  svg::BarChart parts;
  parts.title = "Memory by kind (GiB)";
  parts.value_label = "GiB";
  parts.components = {"parameters", "gradients", "optimizer state", "activations"};
  svg::BarChart phases;
  phases.title = "Peak memory by phase (GiB)";
  phases.value_label = "peak allocated GiB";
  phases.components = {"peak"};
  if (p.settings.gpu_memory_gib) {
    phases.reference = *p.settings.gpu_memory_gib;
    phases.reference_label = "GPU " + fixed(*p.settings.gpu_memory_gib, 1) + " GiB";
  }
  for (const auto& b : p.batches) {
    const auto& m = b.memory;
    if (m.parameter_bytes || m.gradient_bytes || m.optimizer_bytes || m.activation_bytes) {
      parts.bars.push_back({"micro-batch " + std::to_string(b.batch),
                            {gib(m.parameter_bytes.value_or(0)), gib(m.gradient_bytes.value_or(0)),
                             gib(m.optimizer_bytes.value_or(0)), gib(m.activation_bytes.value_or(0))}});
    }
    for (const char* phase : {"forward", "backward", "optimizer"}) {
      const auto it = m.peak_gib_by_phase.find(phase);
      if (it != m.peak_gib_by_phase.end())
        phases.bars.push_back({"micro-batch " + std::to_string(b.batch) + " " + phase, {it->second}});
    }
  }
  std::string html;
  if (!parts.bars.empty()) html += svg::bar_chart(parts);
  if (!phases.bars.empty()) html += svg::bar_chart(phases);
  if (html.empty()) html = note("No memory measurements in this profile (CPU).");
  return html;
}

}  // namespace

std::vector<ModuleBar> module_bars(const formats::BatchProfile& batch, size_t max_bars) {
  // Classes in profile order.
  std::vector<ClassNode> nodes;
  std::map<std::string, int> by_pattern;
  for (size_t i = 0; i < batch.modules.size(); ++i) {
    const auto& m = batch.modules[i];
    const std::string pat = formats::fold_indices(m.fqn);
    auto [it, fresh] = by_pattern.emplace(pat, static_cast<int>(nodes.size()));
    if (fresh) {
      ClassNode n;
      n.pattern = pat;
      n.first_row = i;
      nodes.push_back(n);
    }
    ClassNode& n = nodes[static_cast<size_t>(it->second)];
    ++n.count;
    n.sums.forward_ms += m.forward_ms;
    n.sums.backward_ms += m.backward_ms;
    n.sums.recompute_ms += m.recompute_ms;
    // Pseudo-modules (optimizer, loss, other) have no forward/backward split: their time is self time.
    if (m.kind == "pseudo") n.sums.other_ms += std::max(0.0, m.self_ms - m.forward_ms - m.backward_ms - m.recompute_ms);
  }
  for (size_t i = 0; i < nodes.size(); ++i) {
    const std::string& pat = nodes[i].pattern;
    for (size_t dot = pat.rfind('.'); dot != std::string::npos && dot > 0; dot = pat.rfind('.', dot - 1)) {
      const auto it = by_pattern.find(pat.substr(0, dot));
      if (it != by_pattern.end()) {
        nodes[i].parent = it->second;
        nodes[static_cast<size_t>(it->second)].children.push_back(static_cast<int>(i));
        break;
      }
    }
  }
  double step_total = 0;
  std::vector<int> frontier;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (nodes[i].parent < 0) {
      frontier.push_back(static_cast<int>(i));
      step_total += nodes[i].sums.total();
    }
  }
  // The [rest] of an expanded class: its phases minus its children's, per phase, never negative.
  auto rest_of = [&](int k) {
    ModuleBar r = nodes[static_cast<size_t>(k)].sums;
    for (int c : nodes[static_cast<size_t>(k)].children) {
      const ModuleBar& s = nodes[static_cast<size_t>(c)].sums;
      r.forward_ms -= s.forward_ms;
      r.backward_ms -= s.backward_ms;
      r.recompute_ms -= s.recompute_ms;
      r.other_ms -= s.other_ms;
    }
    r.forward_ms = std::max(0.0, r.forward_ms);
    r.backward_ms = std::max(0.0, r.backward_ms);
    r.recompute_ms = std::max(0.0, r.recompute_ms);
    r.other_ms = std::max(0.0, r.other_ms);
    return r;
  };
  std::vector<int> rests;  // expanded classes whose rest is drawn
  while (true) {
    int best = -1;
    for (int k : frontier) {
      const ClassNode& n = nodes[static_cast<size_t>(k)];
      if (n.children.empty()) continue;
      const bool has_rest = rest_of(k).total() > 0.005 * step_total;
      if (frontier.size() + rests.size() - 1 + n.children.size() + (has_rest ? 1 : 0) > max_bars) continue;
      if (best < 0 || n.sums.total() > nodes[static_cast<size_t>(best)].sums.total()) best = k;
    }
    if (best < 0) break;
    frontier.erase(std::find(frontier.begin(), frontier.end(), best));
    for (int c : nodes[static_cast<size_t>(best)].children) frontier.push_back(c);
    if (rest_of(best).total() > 0.005 * step_total) rests.push_back(best);
  }
  // Profile order; a [rest] bar right before its class's children.
  std::vector<std::pair<std::pair<size_t, int>, ModuleBar>> ordered;
  for (int k : frontier) {
    ModuleBar b = nodes[static_cast<size_t>(k)].sums;
    b.label = class_label(nodes[static_cast<size_t>(k)]);
    ordered.push_back({{nodes[static_cast<size_t>(k)].first_row, 1}, b});
  }
  for (int k : rests) {
    ModuleBar b = rest_of(k);
    b.label = class_label(nodes[static_cast<size_t>(k)]) + " [rest]";
    b.rest = true;
    ordered.push_back({{nodes[static_cast<size_t>(k)].first_row, 0}, b});
  }
  std::sort(ordered.begin(), ordered.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
  std::vector<ModuleBar> out;
  for (auto& [key, b] : ordered) out.push_back(std::move(b));
  return out;
}

std::vector<HotSpot> hot_spots(const formats::BatchProfile& batch) {
  std::vector<HotSpot> out;
  std::map<std::string, size_t> index;
  for (const auto& m : batch.modules) {
    const std::string pat = formats::fold_indices(m.fqn);
    auto [it, fresh] = index.emplace(pat, out.size());
    if (fresh) {
      out.emplace_back();
      out.back().pattern = pat;
      out.back().kind = m.kind;
    }
    HotSpot& h = out[it->second];
    ++h.count;
    h.recomputed += m.recomputed ? 1 : 0;
    h.self_ms += m.self_ms;
    h.forward_ms += m.forward_ms;
    h.backward_ms += m.backward_ms;
    h.recompute_ms += m.recompute_ms;
    h.kernels += m.kernels;
    h.activation_bytes += m.activation_bytes;
  }
  std::stable_sort(out.begin(), out.end(), [](const HotSpot& x, const HotSpot& y) { return x.self_ms > y.self_ms; });
  return out;
}

std::vector<GemmClass> gemm_classes(const std::vector<formats::GemmEntry>& gemms) {
  std::vector<GemmClass> out;
  std::map<std::string, size_t> index;
  for (const auto& g : gemms) {
    const std::string pat = formats::fold_indices(g.name);
    auto [it, fresh] = index.emplace(pat, out.size());
    if (fresh) out.push_back({pat});
    GemmClass& c = out[it->second];
    ++c.count;
    if (g.fp8) {
      if (c.with_fp8 == 0) c.bf16_ms = 0;  // from now on only FP8-measured members count
      ++c.with_fp8;
      c.bf16_ms += g.bf16.total();
      c.fp8_ms += g.fp8->total() + g.quant_ms.value_or(0);
    } else if (c.with_fp8 == 0) {
      c.bf16_ms += g.bf16.total();
    }
  }
  return out;
}

std::optional<double> data_wait_share(const formats::BatchProfile& b) {
  if (!b.data_wait_ms || !(b.step_ms > 0)) return std::nullopt;
  return *b.data_wait_ms / b.step_ms;
}

void add_profile_sections(HtmlPage& page, const formats::Profile& p, const std::string& file) {
  page.add_section("profile", "Profile", summary_section(p, file));
  const formats::BatchProfile& b = p.batches.at(0);
  page.add_section("modules", "Step time by module", module_section(b));
  page.add_section("recompute", "Recompute cost per candidate", recompute_section(b));
  page.add_section("fp8", "FP8 speedup per Linear", fp8_section(p.gemms));
  page.add_section("memory", "Memory by phase", memory_section(p));
}

}  // namespace vlatune::reports
