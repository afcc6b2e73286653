// The only place that talks to CUPTI (the tracer of the profiler issue grows here, behind an interface so
// that a fake can test its degraded paths on the CPU). Torch-free.
#pragma once

#include <string>

namespace vlatune::profiler {

// "CUPTI API <n>" from cuptiGetVersion, or why it is unavailable ("not built with CUDA", a CUPTI error).
std::string cupti_version_text();

}  // namespace vlatune::profiler
