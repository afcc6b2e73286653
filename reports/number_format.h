// Number formatting of the check text, the HTML and the SVG: formats/numbers.h's fixed-decimal text, and p-values.
#pragma once

#include <cstdio>
#include <string>

#include "formats/numbers.h"

namespace vlatune::reports {

using formats::fixed;
using formats::signed_pct;

// A p-value readable at any size: "0.0312", "1.2e-07".
inline std::string p_value_text(double p) {
  char buf[32];
  if (p >= 1e-4 || p == 0) {
    std::snprintf(buf, sizeof buf, "%.4f", p);
  } else {
    std::snprintf(buf, sizeof buf, "%.1e", p);
  }
  return buf;
}

}  // namespace vlatune::reports
