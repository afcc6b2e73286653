// The planner's profile fixtures (tests/fixtures; VLATUNE_FIXTURES_DIR from tests/CMakeLists.txt), each read once
// per test binary: the synthetic Pi0.5 profile and the H200 ones (bf16, and FP8 with the shipped FP8 recipe's Linears
// and e4m3-block GeGLU inputs, nothing recomputed: recipes/pi05_libero_h200_fp8.json was planned from it).
#pragma once

#include <string>

#include "formats/profile.h"

namespace vlatune::test {

inline const std::string kSyntheticProfile = std::string(VLATUNE_FIXTURES_DIR) + "/profile_synthetic_pi05.json";
inline const std::string kH200Profile = std::string(VLATUNE_FIXTURES_DIR) + "/profile_h200_pi05.json";
inline const std::string kH200Fp8Profile = std::string(VLATUNE_FIXTURES_DIR) + "/profile_h200_pi05_fp8.json";

inline const formats::Profile& synthetic_profile() {
  static const formats::Profile p = formats::read_profile(kSyntheticProfile);
  return p;
}

inline const formats::Profile& h200_profile() {
  static const formats::Profile p = formats::read_profile(kH200Profile);
  return p;
}

}  // namespace vlatune::test
