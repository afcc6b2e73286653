// trace.json.gz: the profiled steps in the Chrome Trace Event Format, written as PyTorch's profiler (Kineto) writes
// it, so that Perfetto, chrome://tracing, TensorBoard's trace view and Holistic Trace Analysis read it as one of
// their own:
//   - top level: "schemaVersion" 1, "deviceProperties" (one entry per GPU), "distributedInfo" {backend, rank,
//     world_size} for a data-parallel run, "baseTimeNanoseconds" (the Unix time of ts 0; every "ts" is in us
//     from it) and "traceEvents";
//   - host rows (pid: the process id, tid: the OS thread id): one "ProfilerStep#N" user_annotation spanning each
//     step, our module scopes as user_annotation ranges (name: the FQN; args: step, phase, "External id" = the
//     scope instance), CUDA runtime/driver calls that launched work as cuda_runtime/cuda_driver (args: cbid,
//     correlation), and on the CPU the top-level ATen ops as cpu_op;
//   - device rows (pid: the device id, tid: the stream): kernel / gpu_memcpy / gpu_memset with Kineto's args
//     (device, stream, correlation, grid, block, registers per thread, shared memory where CUPTI reported them,
//     bytes for copies) plus the module and phase they were attributed to;
//   - "ac2g" flow events from each launching call to its work (the pair shares the correlation id).
// Torch-free.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "profiler/records.h"

namespace vlatune::profiler {

// One GPU's entry of "deviceProperties" (cudaDeviceProp's fields, under Kineto's names).
struct DeviceProperties {
  int id = 0;
  std::string name;
  uint64_t total_global_mem = 0;
  int compute_major = 0, compute_minor = 0;
  int max_threads_per_block = 0, max_threads_per_multiprocessor = 0;
  int regs_per_block = 0, regs_per_multiprocessor = 0;
  int warp_size = 0;
  uint64_t shared_mem_per_block = 0, shared_mem_per_multiprocessor = 0, shared_mem_per_block_optin = 0;
  int num_sms = 0;
};

// What the records do not say about the run.
struct TraceMetadata {
  int64_t process_id = 0;        // pid of the host rows
  bool host_ops = false;         // the activities are host-side ATen ops (CPU tracer), not device work
  int rank = 0, world_size = 1;  // "distributedInfo" when world_size >= 2
  std::string backend;           // its "backend": "nccl" | "gloo"
  std::vector<DeviceProperties> devices;
};

// The trace as a JSON document. Steps are those of the scope records: "ProfilerStep#N" spans the scopes of step N
// (on every thread), placed on the thread that opened its first outermost scope.
nlohmann::json chrome_trace(const TraceData& trace, const TraceMetadata& meta);

// Writes `trace` gzip-compressed when `path` ends in ".gz" and zlib is available; otherwise plain JSON at `path`
// without the ".gz". Key and value are separated by ": " as Kineto writes them (HTA finds a trace's rank by
// matching `"rank": N`). Returns the path written. Throws std::runtime_error naming the path on failure.
std::string write_chrome_trace(const nlohmann::json& trace, const std::string& path);

}  // namespace vlatune::profiler
