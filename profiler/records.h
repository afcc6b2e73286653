// The profiler's raw material, free of CUPTI and torch: device activity records (from CUPTI or the CPU tracer)
// and scope records (from the scope recorder). Attribution joins them.
#pragma once

#include <sys/syscall.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "profiler/scope.h"

namespace vlatune::profiler {

// kRuntime/kDriver: a host-side CUDA runtime or driver API call (CUPTI's RUNTIME/DRIVER records), e.g. the
// cudaLaunchKernel whose correlation id the kernel it launched carries. Not device time: attribution skips them;
// the trace shows them on their thread, linked to their work by flow events.
enum class ActivityKind { kKernel, kMemcpy, kMemset, kRuntime, kDriver };

// The calling thread's OS id (gettid): host rows of the trace are keyed by it, as CUPTI keys its API records once
// told to (CUPTI_ACTIVITY_THREAD_ID_TYPE_SYSTEM).
inline uint64_t os_thread_id() {
  static thread_local const uint64_t id = static_cast<uint64_t>(::syscall(SYS_gettid));
  return id;
}

// One kernel, memcpy or memset on the device (or, for the CPU tracer, one top-level ATen op on the host).
// Times in ns on the tracer's clock (CUPTI timestamps; the same clock the scope records use).
struct ActivityRecord {
  ActivityKind kind = ActivityKind::kKernel;
  std::string name;  // kernel name (mangled names are demangled by CUPTI); "memcpy HtoD", "memset"
  uint64_t start_ns = 0, end_ns = 0;
  uint32_t correlation_id = 0;  // CUPTI's launch correlation id (0: none)
  uint32_t stream = 0;
  uint32_t device = 0;
  uint64_t bytes = 0;        // memcpy/memset
  uint64_t graph_node = 0;   // != 0: replayed from a CUDA graph (attribution is per launch, not per kernel)
  uint64_t external_id = 0;  // CPU tracer: the scope instance directly (CUPTI: resolved via correlations)
  uint64_t thread = 0;       // host records (API calls, CPU tracer ops): the OS thread id (0: unknown)
  uint32_t cbid = 0;         // API calls: CUPTI's callback id of the function
  // Kernels, where CUPTI reports them (0: unknown): launch geometry and resources.
  std::array<uint32_t, 3> grid{}, block{};
  uint32_t registers_per_thread = 0;
  uint32_t shared_memory_bytes = 0;  // static + dynamic
};

inline bool is_device_activity(ActivityKind kind) {
  return kind == ActivityKind::kKernel || kind == ActivityKind::kMemcpy || kind == ActivityKind::kMemset;
}

// CUPTI correlation id -> our external id (a scope instance), from EXTERNAL_CORRELATION records.
struct CorrelationRecord {
  uint32_t correlation_id = 0;
  uint64_t external_id = 0;
};

// One opened scope. Ids start at 1 (0 = no scope). A backward instance stands for the backward of the forward
// instance `forward_of`: it inherits that instance's FQN and ancestry, so a module's backward counts towards its
// parents' backward like its forward counts towards their forward.
struct ScopeRecord {
  uint64_t id = 0;
  uint64_t parent = 0;      // enclosing instance on the same thread (0: outermost)
  uint64_t forward_of = 0;  // backward instances only
  int32_t fqn = -1;         // index into TraceData::names
  Phase phase = Phase::kForward;
  int64_t step = 0;
  uint32_t thread = 0;     // small per-process thread number
  uint64_t os_thread = 0;  // the OS thread id (os_thread_id(); 0: unknown)
  uint64_t begin_ns = 0, end_ns = 0;
  int64_t allocated_begin = -1, allocated_end = -1;  // caching-allocator bytes at open/close (-1: not probed)
};

// A GEMM run by a Linear (or a merged GEMM: several member FQNs), y[m, n] = x[m, k] W^T.
struct GemmShapeRecord {
  std::vector<std::string> members;
  int64_t m = 0, k = 0, n = 0;
  Phase phase = Phase::kForward;
};

struct TraceData {
  std::vector<ActivityRecord> activities;
  std::vector<CorrelationRecord> correlations;
  std::vector<ScopeRecord> scopes;
  std::vector<std::string> names;  // FQNs, indexed by ScopeRecord::fqn
  std::vector<GemmShapeRecord> gemms;
  uint64_t dropped_records = 0;
  int64_t unix_minus_clock_ns = 0;    // Unix time minus the records' clock, read when they were taken (0: unknown)
  std::vector<std::string> degraded;  // why the trace is incomplete, for profile.json's settings.degraded
};

}  // namespace vlatune::profiler
