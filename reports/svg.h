// Inline SVG charts drawn by our own code: line charts (runs), horizontal stacked bars (time by module and
// phase, memory by phase, ms/GiB, FP8 speedup) and scatter plots (the tuner's candidate recipes).
// Deterministic: fixed number formatting, no clocks, no randomness, so a report is a golden file. Every chart is
// one <svg class="chart"> element with a <title>, sized in CSS pixels, readable without scripts or fonts beyond
// the generic sans-serif.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace vlatune::reports::svg {

// The palette (Tableau 10): series/component i gets color(i % 10).
const char* color(size_t i);

// &, <, >, " and ' as entities (text and attribute values).
std::string escape(const std::string& text);

struct Series {
  std::string name;
  std::vector<double> x, y;  // equal lengths; a NaN y breaks the line
  int color_index = -1;      // palette entry; -1: the series' position in the chart
  bool faint = false;        // drawn thin and pale (raw samples behind a smoothed line of the same colour)
  bool in_legend = true;     // false: no legend entry (its name still shows on hover)
};

struct LineChart {
  std::string title, x_label, y_label;
  std::vector<Series> series;
  int width = 720, height = 300;
  bool y_from_zero = false;  // include 0 in the y range (throughput), or fit the data (loss)
};
// More than kMaxLinePoints points in a series are averaged into that many buckets (a 100k-step run stays small).
inline constexpr size_t kMaxLinePoints = 1000;
std::string line_chart(const LineChart& chart);

struct Bar {
  std::string label;           // shown left of the bar; a long one is cut at its end, keeping a trailing " ×N"
                               // count (full text on hover)
  std::vector<double> values;  // one per component, >= 0 (negative values are drawn as 0)
};

struct BarChart {
  std::string title, value_label;
  std::vector<std::string> components;  // stack members (legend); one component = plain bars
  std::vector<Bar> bars;                // top to bottom
  std::optional<double> reference;      // a dashed vertical line, e.g. speedup 1.0
  std::string reference_label;
  int width = 720;       // grows (up to kMaxBarChartWidth) so that long labels fit
  int value_digits = 2;  // decimals of the total printed after each bar
};
inline constexpr int kMaxBarChartWidth = 980;
std::string bar_chart(const BarChart& chart);

struct Point {
  std::string label;
  double x = 0, y = 0;
  bool highlight = false;  // drawn larger and labelled (the chosen candidate)
};

struct ScatterChart {
  std::string title, x_label, y_label;
  std::vector<Point> points;
  std::optional<double> x_limit;  // a dashed vertical line, e.g. the memory budget
  std::string x_limit_label;
  int width = 720, height = 340;
};
std::string scatter_chart(const ScatterChart& chart);

// `label` within `max_chars` bytes: cut at its end with "…" (at a UTF-8 character boundary), keeping a trailing
// " ×N" count (and what follows it, such as " [rest]") so that a folded class still says how many modules it stands
// for.
std::string shorten_label(const std::string& label, size_t max_chars);

// "Nice" axis ticks covering [lo, hi] (steps of 1, 2 or 5 x 10^k, about `target` of them).
std::vector<double> nice_ticks(double lo, double hi, int target = 5);

}  // namespace vlatune::reports::svg
