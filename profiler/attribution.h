// Attribution: joins activity records with scope records into profile.json's per-module and per-kernel tables.
// Pure (no CUPTI, no torch): tested on synthetic records.
//
// A kernel belongs to the scope instance whose id it carries (CUPTI: through its launch's external
// correlation; CPU tracer: directly). Its time counts as `self` for that instance's module and, inclusively,
// for every module on the instance's ancestry (backward instances use their forward's ancestry), under the
// instance's phase. Pseudo-modules ("<optimizer>", ...) put their time in forward_ms.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "formats/profile.h"
#include "profiler/records.h"

namespace vlatune::profiler {

struct ModuleInfo {
  std::string kind;  // "Linear", "GemmaDecoderLayer", ...
  int64_t parameter_bytes = 0;
};

struct AttributionResult {
  std::vector<formats::ModuleCost> modules;  // model order: by first appearance in the trace
  std::vector<formats::KernelStat> kernels;  // largest first
  formats::Attribution attribution;
  int64_t graph_kernels = 0;  // kernels replayed from CUDA graphs (attributed to their launch only)
};

// `steps`: traced steps in `trace` (per-step figures are totals / steps). `modules`: kind and parameter bytes
// per FQN (FQNs not listed get kind "pseudo" when they start with '<', else "module").
AttributionResult attribute(const TraceData& trace, int64_t steps, const std::map<std::string, ModuleInfo>& modules);

// The scope instance an activity record ran under: its external id (CUPTI's external correlation), or the one its
// correlation id maps to. Null: outside every scope.
class ScopeLookup {
 public:
  explicit ScopeLookup(const TraceData& trace);
  const ScopeRecord* of(const ActivityRecord& a) const;
  const ScopeRecord* by_id(uint64_t id) const;  // a scope instance (e.g. a parent), or null

 private:
  std::unordered_map<uint32_t, uint64_t> external_of_;  // CUPTI correlation id -> scope instance
  std::unordered_map<uint64_t, const ScopeRecord*> instance_;
};

// Kernel category from its name and record kind ("gemm", "attention", "elementwise", "reduction", "optimizer",
// "memcpy", "memset", "communication", "other").
std::string kernel_category(const std::string& name, ActivityKind kind);

}  // namespace vlatune::profiler
