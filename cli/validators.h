// Flag validators shared by the verbs. CLI11's Range lets NaN through (every comparison with NaN is false), so
// floating-point flags use finite_range.
#pragma once

#include <CLI/CLI.hpp>

#include <cmath>
#include <string>

namespace vlatune::cli {

// A finite number in [min, max]: refuses nan, inf and values outside, naming the value.
inline CLI::Validator finite_range(double min, double max) {
  return CLI::Validator(
      [min, max](std::string& text) -> std::string {
        double v = 0;
        try {
          size_t used = 0;
          v = std::stod(text, &used);
          if (used != text.size()) return "'" + text + "' is not a number";
        } catch (const std::exception&) {
          return "'" + text + "' is not a number";
        }
        if (!std::isfinite(v)) return "'" + text + "' is not a finite number";
        if (v < min || v > max)
          return "'" + text + "' is outside [" + CLI::detail::to_string(min) + ", " + CLI::detail::to_string(max) + "]";
        return "";
      },
      "FINITE in [" + CLI::detail::to_string(min) + " - " + CLI::detail::to_string(max) + "]");
}

}  // namespace vlatune::cli
