// Locale-independent, deterministic number formatting shared by the check text, the HTML and the SVG
// (golden outputs: the same input gives the same bytes on every machine).
#pragma once

#include <cmath>
#include <cstdio>
#include <string>

namespace vlatune::reports {

// x with `digits` decimals ("-0.00" is written "0.00"); non-finite values as "nan", "inf", "-inf".
inline std::string fixed(double x, int digits) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, x);
  std::string s(buf);
  if (s[0] == '-' && s.find_first_not_of("-0.") == std::string::npos) s.erase(0, 1);
  return s;
}

// Signed percentage: "+4.03%", "-0.50%".
inline std::string signed_pct(double pct, int digits = 2) {
  const std::string s = fixed(pct, digits);
  return (s[0] == '-' || s == "nan" ? "" : "+") + s + "%";
}

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
