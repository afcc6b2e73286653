// Chrome/Perfetto trace export (the "Trace Event Format": ui.perfetto.dev and chrome://tracing open it).
// Scopes appear as ranges on their host thread (pid 1, "scopes"), device activity on its stream (pid 2,
// "GPU" or "CPU ops"), each kernel with the module and phase it was attributed to.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "profiler/records.h"

namespace vlatune::profiler {

nlohmann::json chrome_trace(const TraceData& trace, const std::string& device_label);

// Writes `trace` gzip-compressed when `path` ends in ".gz" and zlib is available; otherwise plain JSON at `path`
// without the ".gz". Returns the path written. Throws std::runtime_error naming the path on failure.
std::string write_chrome_trace(const nlohmann::json& trace, const std::string& path);

}  // namespace vlatune::profiler
