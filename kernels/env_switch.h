// A/B switches from the environment (README "Environment switches"), for measurements only: each names a kernel
// or a merge that can be turned off (on_by_default: on unless the variable is "0") or on (off unless "1").
// Torch-free; callers that read on a hot path keep the answer in a function-local static.
#pragma once

#include <cstdlib>
#include <cstring>

namespace vlatune::kernels {

inline bool env_switch(const char* name, bool on_by_default) {
  const char* value = std::getenv(name);
  if (value == nullptr) return on_by_default;
  return on_by_default ? std::strcmp(value, "0") != 0 : std::strcmp(value, "1") == 0;
}

}  // namespace vlatune::kernels
