#include "profiler/cupti_api.h"

#ifdef VLATUNE_HAVE_CUPTI
#include <cupti.h>
#endif

namespace vlatune::profiler {

std::string cupti_version_text() {
#ifdef VLATUNE_HAVE_CUPTI
  uint32_t version = 0;
  const CUptiResult rc = cuptiGetVersion(&version);
  if (rc != CUPTI_SUCCESS) {
    const char* message = nullptr;
    cuptiGetResultString(rc, &message);
    return std::string("CUPTI unavailable: ") + (message ? message : "unknown error");
  }
  return "CUPTI API " + std::to_string(version);
#else
  return "CUPTI not built (configured without CUDA)";
#endif
}

}  // namespace vlatune::profiler
