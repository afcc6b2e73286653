#include "profiler/trace_export.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <stdexcept>
#include <unordered_map>
#include <utility>

#ifdef VLATUNE_HAVE_ZLIB
#include <zlib.h>
#endif

namespace vlatune::profiler {

namespace {

const char* device_category(ActivityKind kind) {
  switch (kind) {
    case ActivityKind::kMemcpy:
      return "gpu_memcpy";
    case ActivityKind::kMemset:
      return "gpu_memset";
    case ActivityKind::kRuntime:
      return "cuda_runtime";
    case ActivityKind::kDriver:
      return "cuda_driver";
    default:
      return "kernel";
  }
}

// Kineto names copies "Memcpy HtoD (...)" and fills "Memset (...)"; HTA tells memory work from compute by that
// capitalized prefix.
std::string device_name(const ActivityRecord& a) {
  std::string name = a.name;
  if ((a.kind == ActivityKind::kMemcpy || a.kind == ActivityKind::kMemset) && !name.empty() && name[0] == 'm')
    name[0] = 'M';
  return name;
}

nlohmann::json metadata_event(const char* name, int64_t pid, int64_t tid, const char* key, nlohmann::json value) {
  return {{"ph", "M"}, {"name", name}, {"pid", pid}, {"tid", tid}, {"ts", 0}, {"args", {{key, std::move(value)}}}};
}

struct StepSpan {
  uint64_t begin_ns = std::numeric_limits<uint64_t>::max(), end_ns = 0;
  uint64_t thread = 0;  // of the earliest outermost scope
  uint64_t first_outer_ns = std::numeric_limits<uint64_t>::max();
};

}  // namespace

nlohmann::json chrome_trace(const TraceData& trace, const TraceMetadata& meta) {
  uint64_t origin = std::numeric_limits<uint64_t>::max();
  for (const auto& s : trace.scopes) origin = std::min(origin, s.begin_ns);
  for (const auto& a : trace.activities) origin = std::min(origin, a.start_ns);
  if (origin == std::numeric_limits<uint64_t>::max()) origin = 0;
  auto us = [origin](uint64_t ns) { return static_cast<double>(ns - std::min(ns, origin)) / 1e3; };
  auto dur_us = [](uint64_t begin, uint64_t end) { return static_cast<double>(end - std::min(end, begin)) / 1e3; };
  const int64_t host = meta.process_id;
  auto host_tid = [](uint64_t os_thread, uint64_t fallback) {
    return static_cast<int64_t>(os_thread != 0 ? os_thread : fallback);
  };

  std::unordered_map<uint32_t, uint64_t> external_of;
  for (const auto& c : trace.correlations) external_of[c.correlation_id] = c.external_id;
  auto external = [&external_of](const ActivityRecord& a) {
    if (a.external_id != 0) return a.external_id;
    auto it = external_of.find(a.correlation_id);
    return it != external_of.end() ? it->second : uint64_t{0};
  };
  std::unordered_map<uint64_t, const ScopeRecord*> instance;
  for (const auto& s : trace.scopes) instance[s.id] = &s;
  auto name_of = [&trace](int32_t fqn) {
    return fqn >= 0 && static_cast<size_t>(fqn) < trace.names.size() ? trace.names[static_cast<size_t>(fqn)]
                                                                     : std::string("?");
  };
  auto attribute = [&](nlohmann::json* args, uint64_t ext) {
    if (ext == 0) return;
    (*args)["External id"] = ext;
    auto inst = instance.find(ext);
    if (inst == instance.end()) return;
    (*args)["module"] = name_of(inst->second->fqn);
    (*args)["phase"] = phase_name(inst->second->phase);
  };

  nlohmann::json events = nlohmann::json::array();
  events.push_back(metadata_event("process_name", host, 0, "name", "vlatune"));

  // ProfilerStep#N from the scopes of each step.
  std::map<int64_t, StepSpan> steps;
  for (const auto& s : trace.scopes) {
    if (s.end_ns < s.begin_ns) continue;
    StepSpan& span = steps[s.step];
    span.begin_ns = std::min(span.begin_ns, s.begin_ns);
    span.end_ns = std::max(span.end_ns, s.end_ns);
    if (s.parent == 0 && s.forward_of == 0 && s.begin_ns < span.first_outer_ns) {
      span.first_outer_ns = s.begin_ns;
      span.thread = static_cast<uint64_t>(host_tid(s.os_thread, s.thread));
    }
  }
  for (const auto& [step, span] : steps) {
    events.push_back({{"ph", "X"},
                      {"cat", "user_annotation"},
                      {"name", "ProfilerStep#" + std::to_string(step)},
                      {"pid", host},
                      {"tid", span.thread},
                      {"ts", us(span.begin_ns)},
                      {"dur", dur_us(span.begin_ns, span.end_ns)},
                      {"args", {{"step", step}}}});
  }
  for (const auto& s : trace.scopes) {
    if (s.end_ns < s.begin_ns) continue;
    events.push_back({{"ph", "X"},
                      {"cat", "user_annotation"},
                      {"name", name_of(s.fqn)},
                      {"pid", host},
                      {"tid", host_tid(s.os_thread, s.thread)},
                      {"ts", us(s.begin_ns)},
                      {"dur", dur_us(s.begin_ns, s.end_ns)},
                      {"args", {{"External id", s.id}, {"step", s.step}, {"phase", phase_name(s.phase)}}}});
  }

  if (meta.host_ops) {
    for (const auto& a : trace.activities) {
      nlohmann::json args = nlohmann::json::object();
      attribute(&args, external(a));
      events.push_back({{"ph", "X"},
                        {"cat", "cpu_op"},
                        {"name", a.name},
                        {"pid", host},
                        {"tid", host_tid(a.thread, 0)},
                        {"ts", us(a.start_ns)},
                        {"dur", dur_us(a.start_ns, a.end_ns)},
                        {"args", args}});
    }
    return {{"schemaVersion", 1},
            {"deviceProperties", nlohmann::json::array()},
            {"displayTimeUnit", "ms"},
            {"baseTimeNanoseconds", static_cast<int64_t>(origin) + trace.unix_minus_clock_ns},
            {"traceEvents", events}};
  }

  // Device work, and the API calls that launched it (a call that launched nothing is left out).
  std::unordered_map<uint32_t, const ActivityRecord*> launch_of;
  std::set<uint32_t> launched;
  for (const auto& a : trace.activities)
    if (is_device_activity(a.kind) && a.correlation_id != 0) launched.insert(a.correlation_id);
  std::set<std::pair<uint32_t, uint32_t>> streams;  // (device, stream)
  for (const auto& a : trace.activities) {
    if (is_device_activity(a.kind)) {
      streams.insert({a.device, a.stream});
      continue;
    }
    if (launched.count(a.correlation_id) == 0) continue;
    launch_of.emplace(a.correlation_id, &a);
    nlohmann::json args = {{"cbid", a.cbid}, {"correlation", a.correlation_id}};
    attribute(&args, external(a));
    events.push_back({{"ph", "X"},
                      {"cat", device_category(a.kind)},
                      {"name", a.name},
                      {"pid", host},
                      {"tid", host_tid(a.thread, 0)},
                      {"ts", us(a.start_ns)},
                      {"dur", dur_us(a.start_ns, a.end_ns)},
                      {"args", args}});
  }
  std::set<uint32_t> flowed;
  for (const auto& a : trace.activities) {
    if (!is_device_activity(a.kind)) continue;
    nlohmann::json args = {{"device", a.device}, {"stream", a.stream}, {"correlation", a.correlation_id}};
    if (a.kind == ActivityKind::kKernel && a.grid[0] != 0) {
      args["grid"] = a.grid;
      args["block"] = a.block;
      args["registers per thread"] = a.registers_per_thread;
      args["shared memory"] = a.shared_memory_bytes;
    }
    if (a.bytes != 0) args["bytes"] = a.bytes;
    if (a.graph_node != 0) args["graph node id"] = a.graph_node;
    attribute(&args, external(a));
    events.push_back({{"ph", "X"},
                      {"cat", device_category(a.kind)},
                      {"name", device_name(a)},
                      {"pid", a.device},
                      {"tid", a.stream},
                      {"ts", us(a.start_ns)},
                      {"dur", dur_us(a.start_ns, a.end_ns)},
                      {"args", args}});
    // One flow per launch, to its first piece of work (a graph launch runs many kernels under one correlation).
    auto launch = launch_of.find(a.correlation_id);
    if (launch == launch_of.end() || !flowed.insert(a.correlation_id).second) continue;
    const ActivityRecord& call = *launch->second;
    events.push_back({{"ph", "s"},
                      {"id", a.correlation_id},
                      {"pid", host},
                      {"tid", host_tid(call.thread, 0)},
                      {"ts", us(call.start_ns)},
                      {"cat", "ac2g"},
                      {"name", "ac2g"}});
    events.push_back({{"ph", "f"},
                      {"id", a.correlation_id},
                      {"pid", a.device},
                      {"tid", a.stream},
                      {"ts", us(a.start_ns)},
                      {"cat", "ac2g"},
                      {"name", "ac2g"},
                      {"bp", "e"}});
  }

  std::set<uint32_t> devices;
  for (const auto& [device, stream] : streams) devices.insert(device);
  for (uint32_t d : devices) {
    events.push_back(metadata_event("process_name", d, 0, "name", "GPU " + std::to_string(d)));
    for (const auto& p : meta.devices)
      if (p.id == static_cast<int>(d)) events.push_back(metadata_event("process_labels", d, 0, "labels", p.name));
  }
  for (const auto& [device, stream] : streams)
    events.push_back(metadata_event("thread_name", device, stream, "name", "stream " + std::to_string(stream)));

  nlohmann::json properties = nlohmann::json::array();
  for (const auto& p : meta.devices)
    properties.push_back({{"id", p.id},
                          {"name", p.name},
                          {"totalGlobalMem", p.total_global_mem},
                          {"computeMajor", p.compute_major},
                          {"computeMinor", p.compute_minor},
                          {"maxThreadsPerBlock", p.max_threads_per_block},
                          {"maxThreadsPerMultiprocessor", p.max_threads_per_multiprocessor},
                          {"regsPerBlock", p.regs_per_block},
                          {"regsPerMultiprocessor", p.regs_per_multiprocessor},
                          {"warpSize", p.warp_size},
                          {"sharedMemPerBlock", p.shared_mem_per_block},
                          {"sharedMemPerMultiprocessor", p.shared_mem_per_multiprocessor},
                          {"sharedMemPerBlockOptin", p.shared_mem_per_block_optin},
                          {"numSms", p.num_sms}});
  nlohmann::json out = {{"schemaVersion", 1},
                        {"deviceProperties", properties},
                        {"displayTimeUnit", "ms"},
                        {"baseTimeNanoseconds", static_cast<int64_t>(origin) + trace.unix_minus_clock_ns},
                        {"traceEvents", events}};
  if (meta.world_size >= 2)
    out["distributedInfo"] = {{"backend", meta.backend}, {"rank", meta.rank}, {"world_size", meta.world_size}};
  return out;
}

std::string write_chrome_trace(const nlohmann::json& trace, const std::string& path) {
  // Indent 0: one member per line and ": " between key and value, as Kineto writes them.
  const std::string text = trace.dump(0);
  const bool gz = path.size() > 3 && path.compare(path.size() - 3, 3, ".gz") == 0;
#ifdef VLATUNE_HAVE_ZLIB
  if (gz) {
    gzFile f = gzopen(path.c_str(), "wb6");
    if (f == nullptr) throw std::runtime_error(path + ": cannot write: " + std::strerror(errno));
    const int written = gzwrite(f, text.data(), static_cast<unsigned>(text.size()));
    if (gzclose(f) != Z_OK || written != static_cast<int>(text.size()))
      throw std::runtime_error(path + ": write failed");
    return path;
  }
#endif
  const std::string plain = gz ? path.substr(0, path.size() - 3) : path;
  std::ofstream out(plain, std::ios::binary);
  out << text;
  if (!out) throw std::runtime_error(plain + ": cannot write: " + std::strerror(errno));
  return plain;
}

}  // namespace vlatune::profiler
