#include "profiler/comm_stats.h"

#include <algorithm>
#include <map>
#include <unordered_map>

#include "formats/numbers.h"
#include "profiler/attribution.h"
#include "profiler/scope.h"

namespace vlatune::profiler {

namespace {

const std::string kCommPrefix = std::string(kCommScope) + ":";

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

}  // namespace

std::string comm_scope_name(const std::string& group) {
  return kCommPrefix + group;
}

std::string attribution_module_name(const std::string& scope_name) {
  return starts_with(scope_name, kCommPrefix) ? std::string(kCommScope) : scope_name;
}

CommStats communication_from_trace(const TraceData& trace, const std::vector<CommGroupInfo>& groups, int world_size) {
  const ScopeLookup lookup(trace);

  CommStats out;
  std::map<int64_t, uint64_t> nccl_end, backward_end;         // per step
  std::map<int64_t, std::map<std::string, double>> group_ms;  // per step, per group
  for (const ActivityRecord& a : trace.activities) {
    if (!is_device_activity(a.kind)) continue;  // a host API call: not device time
    const bool nccl = kernel_category(a.name, a.kind) == "communication";
    const ScopeRecord* scope_record = lookup.of(a);
    if (scope_record == nullptr) {
      if (nccl) ++out.unattributed_nccl;
      continue;
    }
    const ScopeRecord& s = *scope_record;
    if (s.fqn < 0 || static_cast<size_t>(s.fqn) >= trace.names.size()) continue;
    const std::string& scope = trace.names[static_cast<size_t>(s.fqn)];
    const bool comm_scope = scope == kCommScope || starts_with(scope, kCommPrefix);
    if (nccl && comm_scope) {
      uint64_t& end = nccl_end[s.step];
      end = std::max(end, a.end_ns);
      if (starts_with(scope, kCommPrefix)) {
        const double ms = static_cast<double>(a.end_ns > a.start_ns ? a.end_ns - a.start_ns : 0) / 1e6;
        group_ms[s.step][scope.substr(kCommPrefix.size())] += ms;
      }
    } else if (!nccl && !comm_scope && (s.phase == Phase::kBackward || s.phase == Phase::kRecompute)) {
      uint64_t& end = backward_end[s.step];
      end = std::max(end, a.end_ns);
    }
  }

  formats::Communication& c = out.communication;
  c.world_size = world_size;
  out.steps = static_cast<int64_t>(nccl_end.size());
  for (const auto& [step, end] : nccl_end) {
    auto b = backward_end.find(step);
    if (b == backward_end.end()) continue;  // no backward kernel seen in this step: nothing to compare with
    out.exposed_ms_per_step.push_back(end > b->second ? static_cast<double>(end - b->second) / 1e6 : 0.0);
  }
  // No step with a backward kernel to compare with: nothing measured exposed.
  c.exposed_ms = out.exposed_ms_per_step.empty() ? 0.0 : formats::median(out.exposed_ms_per_step);
  int64_t total_bytes = 0;
  double total_ms = 0;
  for (const CommGroupInfo& g : groups) {
    std::vector<double> per_step;
    for (const auto& [step, end] : nccl_end) {
      const auto& by_group = group_ms[step];
      auto it = by_group.find(g.name);
      per_step.push_back(it == by_group.end() ? 0.0 : it->second);
    }
    const double ms = per_step.empty() ? 0.0 : formats::median(per_step);
    c.groups.push_back({g.name, g.bytes, ms});
    total_bytes += g.bytes;
    total_ms += ms;
  }
  const double n = static_cast<double>(world_size);
  if (total_ms > 0 && world_size >= 2)
    c.allreduce_gbps = static_cast<double>(total_bytes) * 2.0 * (n - 1.0) / n / (total_ms * 1e6);
  return out;
}

}  // namespace vlatune::profiler
