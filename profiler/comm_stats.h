// profile.json's `communication` section from kernel records (trainer/distributed.h, "Profiler"). Pure (no CUPTI,
// no torch): tested on synthetic records.
//
// GradBuckets launches each group's all-reduce inside a scope named comm_scope_name(group) ("<comm>:heads.out");
// the attribution tables fold those scopes into the one pseudo-module "<comm>" (attribution_module_name). Here:
//   groups[i].allreduce_ms  per step, the time of the NCCL kernels ("communication" category) launched inside the
//                           group's scope; median over the steps
//   allreduce_gbps          bus bandwidth: sum(bytes) x 2 (n-1)/n / sum(allreduce_ms) (the ring formula the tuner
//                           inverts, tuner/grouping.h allreduce_ms); 0 when no NCCL kernel was seen
//   exposed_ms              per step, end of the last NCCL kernel launched from a "<comm>" scope minus the end of
//                           the last backward compute kernel (phase backward or recompute, outside "<comm>"
//                           scopes, not NCCL); 0 when communication finished first; median over the steps
// A kernel's step is its scope instance's step; kernels outside any scope are counted in `unattributed_nccl`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "formats/profile.h"
#include "profiler/records.h"

namespace vlatune::profiler {

// "<comm>:" + group: the scope a group's all-reduce is launched in (trainer/grad_buckets.cpp spells it the same
// way: the trainer does not link the profiler).
std::string comm_scope_name(const std::string& group);
// The module a scope counts for in the attribution tables: "<comm>" for every "<comm>:group", else the name.
std::string attribution_module_name(const std::string& scope_name);

struct CommGroupInfo {
  std::string name;   // GradBuckets group (launch order)
  int64_t bytes = 0;  // bytes all-reduced for it per step
};

struct CommStats {
  formats::Communication communication;
  int64_t steps = 0;              // steps with communication kernels
  int64_t unattributed_nccl = 0;  // NCCL kernels outside any scope (not counted)
  std::vector<double> exposed_ms_per_step;
};

// `world_size` >= 2. Groups with no kernel get allreduce_ms 0.
CommStats communication_from_trace(const TraceData& trace, const std::vector<CommGroupInfo>& groups, int world_size);

}  // namespace vlatune::profiler
