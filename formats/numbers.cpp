#include "formats/numbers.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace vlatune::formats {

double median(std::vector<double> values) {
  values.erase(std::remove_if(values.begin(), values.end(), [](double x) { return !std::isfinite(x); }), values.end());
  if (values.empty()) return std::nan("");
  const size_t mid = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(mid), values.end());
  const double hi = values[mid];
  if (values.size() % 2 == 1) return hi;
  const double lo = *std::max_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(mid));
  return 0.5 * (lo + hi);
}

std::string fixed(double x, int digits) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, x);
  std::string s(buf);
  if (s[0] == '-' && s.find_first_not_of("-0.") == std::string::npos) s.erase(0, 1);
  return s;
}

std::string signed_pct(double pct, int digits) {
  const std::string s = fixed(pct, digits);
  return (s[0] == '-' || s == "nan" ? "" : "+") + s + "%";
}

std::string prediction_versus_measured(double predicted, double measured) {
  if (!std::isfinite(predicted) || !std::isfinite(measured) || measured == 0) return "-";
  const std::string pct = fixed(std::fabs(predicted / measured - 1) * 100, 1);
  if (pct == "0.0") return "predicted = measured";
  return "predicted " + pct + "% " + (predicted > measured ? "above" : "below") + " measured";
}

}  // namespace vlatune::formats
