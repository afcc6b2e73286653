#include "profiler/attribution.h"

#include <algorithm>
#include <map>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "formats/fqn_pattern.h"
#include "profiler/comm_stats.h"

namespace vlatune::profiler {

namespace {

bool contains(const std::string& s, const char* part) {
  return s.find(part) != std::string::npos;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

struct SiteAcc {
  double calls = 0, ms = 0;
};

struct KernelAcc {
  std::string category;
  double calls = 0, ms = 0;
  std::map<std::pair<std::string, Phase>, SiteAcc> sites;  // (module, layer indices folded; phase)
};

// Per kernel name, largest first, each with its sites, largest first, at most formats::kMaxKernelSites.
std::vector<formats::KernelStat> sorted_stats(const std::unordered_map<std::string, KernelAcc>& acc, double steps) {
  std::vector<formats::KernelStat> out;
  for (const auto& [name, a] : acc) {
    formats::KernelStat k{name, a.category, a.calls / steps, a.ms / steps, {}};
    for (const auto& [where, site] : a.sites)
      k.sites.push_back({where.first, phase_name(where.second), site.calls / steps, site.ms / steps});
    std::sort(k.sites.begin(), k.sites.end(), [](const auto& x, const auto& y) {
      return x.ms != y.ms ? x.ms > y.ms : std::tie(x.module, x.phase) < std::tie(y.module, y.phase);
    });
    if (k.sites.size() > formats::kMaxKernelSites) k.sites.resize(formats::kMaxKernelSites);
    out.push_back(std::move(k));
  }
  std::sort(out.begin(), out.end(),
            [](const auto& a, const auto& b) { return a.ms != b.ms ? a.ms > b.ms : a.name < b.name; });
  return out;
}

}  // namespace

std::string kernel_category(const std::string& name, ActivityKind kind) {
  if (kind == ActivityKind::kMemcpy) return "memcpy";
  if (kind == ActivityKind::kMemset) return "memset";
  const std::string n = lower(name);
  if (contains(n, "nccl")) return "communication";
  if (contains(n, "flash") || contains(n, "fmha") || contains(n, "attention") || contains(n, "sdpa") ||
      contains(n, "cudnn"))
    return "attention";
  if (contains(n, "adamw") || contains(n, "multi_tensor") || contains(n, "grad_norm")) return "optimizer";
  if (contains(n, "gemm") || contains(n, "nvjet") || contains(n, "cutlass") || contains(n, "xmma") ||
      contains(n, "cublas") || contains(n, "aten::mm") || contains(n, "aten::addmm") || contains(n, "aten::bmm") ||
      contains(n, "aten::linear") || contains(n, "aten::matmul") || contains(n, "scaled_mm") ||
      contains(n, "convolution") || contains(n, "conv2d"))
    return "gemm";
  if (contains(n, "reduce") || contains(n, "norm") || contains(n, "softmax") || contains(n, "aten::sum") ||
      contains(n, "aten::mean"))
    return "reduction";
  if (contains(n, "elementwise") || contains(n, "vectorized") || contains(n, "unrolled") || contains(n, "vlatune") ||
      contains(n, "aten::"))
    return "elementwise";
  return "other";
}

ScopeLookup::ScopeLookup(const TraceData& trace) {
  for (const auto& c : trace.correlations) external_of_[c.correlation_id] = c.external_id;
  for (const auto& s : trace.scopes) instance_[s.id] = &s;
}

const ScopeRecord* ScopeLookup::of(const ActivityRecord& a) const {
  uint64_t ext = a.external_id;
  if (ext == 0) {
    auto it = external_of_.find(a.correlation_id);
    if (it != external_of_.end()) ext = it->second;
  }
  return ext == 0 ? nullptr : by_id(ext);
}

const ScopeRecord* ScopeLookup::by_id(uint64_t id) const {
  auto inst = instance_.find(id);
  return inst == instance_.end() ? nullptr : inst->second;
}

AttributionResult attribute(const TraceData& trace, int64_t steps, const std::map<std::string, ModuleInfo>& modules) {
  const double per_step = static_cast<double>(std::max<int64_t>(steps, 1));
  const ScopeLookup lookup(trace);

  // Module rows in order of first appearance.
  // Scopes of one module share its row: the per-group "<comm>:group" scopes all count for "<comm>" (comm_stats.h).
  std::vector<formats::ModuleCost> rows;
  std::unordered_map<int32_t, size_t> row_of;
  std::unordered_map<std::string, size_t> row_of_name;
  auto row_index = [&](int32_t fqn) -> size_t {
    auto it = row_of.find(fqn);
    if (it != row_of.end()) return it->second;
    const std::string name = attribution_module_name(trace.names.at(static_cast<size_t>(fqn)));
    auto named = row_of_name.find(name);
    if (named != row_of_name.end()) {
      row_of.emplace(fqn, named->second);
      return named->second;
    }
    formats::ModuleCost m;
    m.fqn = name;
    auto info = modules.find(m.fqn);
    if (info != modules.end()) {
      m.kind = info->second.kind;
      m.parameter_bytes = info->second.parameter_bytes;
    } else {
      m.kind = !m.fqn.empty() && m.fqn[0] == '<' ? "pseudo" : "module";
    }
    row_of.emplace(fqn, rows.size());
    row_of_name.emplace(m.fqn, rows.size());
    rows.push_back(std::move(m));
    return rows.size() - 1;
  };
  auto row = [&](int32_t fqn) -> formats::ModuleCost& { return rows[row_index(fqn)]; };
  for (const auto& s : trace.scopes) {
    if (s.fqn >= 0) row(s.fqn);
  }

  AttributionResult result;
  std::unordered_map<std::string, KernelAcc> all, unattributed;
  double total_ms = 0, attributed_ms = 0;
  std::vector<size_t> chain;                            // rows
  std::unordered_map<size_t, std::string> folded_name;  // row -> its FQN with layer indices folded (kernel sites)
  for (const ActivityRecord& a : trace.activities) {
    if (!is_device_activity(a.kind)) continue;  // a host API call: not device time
    const double ms = static_cast<double>(a.end_ns > a.start_ns ? a.end_ns - a.start_ns : 0) / 1e6;
    total_ms += ms;
    KernelAcc& k = all[a.name];
    if (k.category.empty()) k.category = kernel_category(a.name, a.kind);
    k.calls += 1;
    k.ms += ms;
    if (a.graph_node != 0) ++result.graph_kernels;

    const ScopeRecord* scope = lookup.of(a);
    if (scope == nullptr) {
      KernelAcc& u = unattributed[a.name];
      u.category = k.category;
      u.calls += 1;
      u.ms += ms;
      continue;
    }
    attributed_ms += ms;
    const ScopeRecord& s = *scope;
    const size_t own_row = row_index(s.fqn);
    rows[own_row].self_ms += ms / per_step;
    auto folded = folded_name.find(own_row);
    if (folded == folded_name.end())
      folded = folded_name.emplace(own_row, formats::fold_indices(rows[own_row].fqn)).first;
    SiteAcc& site = k.sites[{folded->second, s.phase}];
    site.calls += 1;
    site.ms += ms;
    // Ancestry: the instance's module, then its parents' (distinct modules only).
    chain.clear();
    chain.push_back(own_row);
    for (uint64_t p = s.parent; p != 0;) {
      const ScopeRecord* parent = lookup.by_id(p);
      if (parent == nullptr) break;
      const size_t r = row_index(parent->fqn);
      if (std::find(chain.begin(), chain.end(), r) == chain.end()) chain.push_back(r);
      p = parent->parent;
    }
    for (size_t r : chain) {
      formats::ModuleCost& m = rows[r];
      m.kernels += 1;  // launches, inclusive; divided by the step count below
      switch (s.phase) {
        case Phase::kBackward:
          m.backward_ms += ms / per_step;
          break;
        case Phase::kRecompute:
          m.recompute_ms += ms / per_step;
          break;
        default:
          m.forward_ms += ms / per_step;
          break;
      }
    }
  }
  for (auto& m : rows) m.kernels = static_cast<int64_t>(static_cast<double>(m.kernels) / per_step + 0.5);

  // Activation bytes: allocator growth over each forward (not recompute) instance, per step.
  std::unordered_map<int32_t, double> activation;
  for (const auto& s : trace.scopes) {
    if (s.phase != Phase::kForward || s.allocated_begin < 0 || s.allocated_end < 0 || s.fqn < 0) continue;
    activation[s.fqn] += static_cast<double>(s.allocated_end - s.allocated_begin);
  }
  for (const auto& [fqn, bytes] : activation) {
    row(fqn).activation_bytes += std::max<int64_t>(0, static_cast<int64_t>(bytes / per_step));
  }

  result.modules = std::move(rows);
  result.kernels = sorted_stats(all, per_step);
  result.attribution.gpu_ms = total_ms / per_step;
  result.attribution.attributed_fraction = total_ms > 0 ? attributed_ms / total_ms : 1.0;
  result.attribution.dropped_records = static_cast<int64_t>(trace.dropped_records);
  result.attribution.unattributed = sorted_stats(unattributed, per_step);
  return result;
}

}  // namespace vlatune::profiler
