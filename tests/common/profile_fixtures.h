// The planner's profile fixtures (tests/fixtures; VLATUNE_FIXTURES_DIR from tests/CMakeLists.txt), each read once
// per test binary: the synthetic Pi0.5 profile and the H200 one.
#pragma once

#include <string>

#include "formats/profile.h"

namespace vlatune::test {

inline const std::string kSyntheticProfile = std::string(VLATUNE_FIXTURES_DIR) + "/profile_synthetic_pi05.json";
inline const std::string kH200Profile = std::string(VLATUNE_FIXTURES_DIR) + "/profile_h200_pi05.json";

inline const formats::Profile& synthetic_profile() {
  static const formats::Profile p = formats::read_profile(kSyntheticProfile);
  return p;
}

inline const formats::Profile& h200_profile() {
  static const formats::Profile p = formats::read_profile(kH200Profile);
  return p;
}

}  // namespace vlatune::test
