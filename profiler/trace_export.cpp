#include "profiler/trace_export.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <stdexcept>
#include <unordered_map>

#ifdef VLATUNE_HAVE_ZLIB
#include <zlib.h>
#endif

namespace vlatune::profiler {

nlohmann::json chrome_trace(const TraceData& trace, const std::string& device_label) {
  uint64_t origin = std::numeric_limits<uint64_t>::max();
  for (const auto& s : trace.scopes) origin = std::min(origin, s.begin_ns);
  for (const auto& a : trace.activities) origin = std::min(origin, a.start_ns);
  if (origin == std::numeric_limits<uint64_t>::max()) origin = 0;
  auto us = [origin](uint64_t ns) { return static_cast<double>(ns - std::min(ns, origin)) / 1e3; };

  std::unordered_map<uint32_t, uint64_t> external_of;
  for (const auto& c : trace.correlations) external_of[c.correlation_id] = c.external_id;
  std::unordered_map<uint64_t, const ScopeRecord*> instance;
  for (const auto& s : trace.scopes) instance[s.id] = &s;
  auto name_of = [&trace](int32_t fqn) {
    return fqn >= 0 && static_cast<size_t>(fqn) < trace.names.size() ? trace.names[static_cast<size_t>(fqn)]
                                                                     : std::string("?");
  };

  nlohmann::json events = nlohmann::json::array();
  events.push_back({{"ph", "M"}, {"pid", 1}, {"name", "process_name"}, {"args", {{"name", "scopes"}}}});
  events.push_back({{"ph", "M"}, {"pid", 2}, {"name", "process_name"}, {"args", {{"name", device_label}}}});
  for (const auto& s : trace.scopes) {
    if (s.end_ns < s.begin_ns) continue;
    events.push_back({{"ph", "X"},
                      {"pid", 1},
                      {"tid", s.thread},
                      {"ts", us(s.begin_ns)},
                      {"dur", static_cast<double>(s.end_ns - s.begin_ns) / 1e3},
                      {"name", name_of(s.fqn)},
                      {"cat", phase_name(s.phase)},
                      {"args", {{"step", s.step}, {"phase", phase_name(s.phase)}, {"instance", s.id}}}});
  }
  for (const auto& a : trace.activities) {
    uint64_t ext = a.external_id;
    if (ext == 0) {
      auto it = external_of.find(a.correlation_id);
      if (it != external_of.end()) ext = it->second;
    }
    nlohmann::json args = {{"correlation", a.correlation_id}};
    auto inst = instance.find(ext);
    if (inst != instance.end()) {
      args["module"] = name_of(inst->second->fqn);
      args["phase"] = phase_name(inst->second->phase);
    }
    if (a.bytes != 0) args["bytes"] = a.bytes;
    events.push_back({{"ph", "X"},
                      {"pid", 2},
                      {"tid", a.stream},
                      {"ts", us(a.start_ns)},
                      {"dur", static_cast<double>(a.end_ns - std::min(a.end_ns, a.start_ns)) / 1e3},
                      {"name", a.name},
                      {"cat", "device"},
                      {"args", args}});
  }
  return {{"traceEvents", events}, {"displayTimeUnit", "ms"}};
}

std::string write_chrome_trace(const nlohmann::json& trace, const std::string& path) {
  const std::string text = trace.dump();
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
