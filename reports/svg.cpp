#include "reports/svg.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "reports/number_format.h"

namespace vlatune::reports::svg {

namespace {

constexpr const char* kPalette[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                    "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};
constexpr double kCharWidth = 6.2;  // average width of an 11 px sans-serif character, for label columns

// Coordinates with one decimal: enough for screen pixels, stable across machines.
std::string px(double v) {
  return fixed(v, 1);
}

struct Range {
  double lo, hi;
  std::vector<double> ticks;  // inside [lo, hi], first == lo and last == hi
};

// The range of the finite values (with optional 0), widened when degenerate, extended to the outer ticks.
Range fit_range(const std::vector<double>& values, bool include_zero) {
  double lo = HUGE_VAL, hi = -HUGE_VAL;
  for (double v : values) {
    if (!std::isfinite(v)) continue;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  if (lo > hi) lo = hi = 0;  // no data
  if (include_zero) {
    lo = std::min(lo, 0.0);
    hi = std::max(hi, 0.0);
  }
  if (hi - lo < 1e-12 * std::max(1.0, std::fabs(hi))) {
    const double pad = std::fabs(hi) > 0 ? std::fabs(hi) * 0.1 : 1.0;
    lo -= include_zero && lo == 0 ? 0 : pad;
    hi += pad;
  }
  std::vector<double> t = nice_ticks(lo, hi);
  return {std::min(lo, t.front()), std::max(hi, t.back()), std::move(t)};
}

int tick_digits(const std::vector<double>& ticks) {
  if (ticks.size() < 2) return 0;
  const double step = ticks[1] - ticks[0];
  return std::clamp(static_cast<int>(-std::floor(std::log10(step) + 1e-9)), 0, 6);
}

void open_svg(std::ostringstream& o, int width, int height, const std::string& title) {
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" width=\"" << width << "\" height=\"" << height
    << "\" viewBox=\"0 0 " << width << " " << height << "\" role=\"img\" font-family=\"sans-serif\" font-size=\"11\">"
    << "<title>" << escape(title) << "</title>"
    << "<rect width=\"" << width << "\" height=\"" << height << "\" fill=\"#ffffff\"/>"
    << "<text x=\"8\" y=\"16\" font-size=\"13\" font-weight=\"bold\" fill=\"#222\">" << escape(title) << "</text>";
}

// Legend entries in one row starting at (x, y); wraps to further rows of 14 px when the row is full. Entry i has
// palette colour colors[i] (default: i).
void legend(std::ostringstream& o, const std::vector<std::string>& names, double x0, double y0, double max_x,
            std::vector<size_t> colors = {}) {
  for (size_t i = colors.size(); i < names.size(); ++i) colors.push_back(i);
  double x = x0, y = y0;
  for (size_t i = 0; i < names.size(); ++i) {
    const double w = 18 + kCharWidth * static_cast<double>(names[i].size()) + 12;
    if (x + w > max_x && x > x0) {
      x = x0;
      y += 14;
    }
    o << "<rect x=\"" << px(x) << "\" y=\"" << px(y - 8) << "\" width=\"12\" height=\"8\" fill=\"" << color(colors[i])
      << "\"/><text x=\"" << px(x + 16) << "\" y=\"" << px(y) << "\" fill=\"#333\">" << escape(names[i]) << "</text>";
    x += w;
  }
}

double legend_rows(const std::vector<std::string>& names, double x0, double max_x) {
  double x = x0;
  int rows = names.empty() ? 0 : 1;
  for (const auto& n : names) {
    const double w = 18 + kCharWidth * static_cast<double>(n.size()) + 12;
    if (x + w > max_x && x > x0) {
      x = x0;
      ++rows;
    }
    x += w;
  }
  return rows;
}

// Axis lines, grid and tick labels of a plot area [x0, x1] x [y0, y1] (y0 top).
void axes(std::ostringstream& o, double x0, double x1, double y0, double y1, const Range& xr, const Range& yr,
          const std::string& x_label, const std::string& y_label) {
  const std::vector<double>&xt = xr.ticks, &yt = yr.ticks;
  const int xd = tick_digits(xt), yd = tick_digits(yt);
  o << "<g stroke=\"#e4e4e4\" stroke-width=\"1\">";
  for (double t : yt) {
    const double y = y1 - (t - yr.lo) / (yr.hi - yr.lo) * (y1 - y0);
    o << "<line x1=\"" << px(x0) << "\" y1=\"" << px(y) << "\" x2=\"" << px(x1) << "\" y2=\"" << px(y) << "\"/>";
  }
  o << "</g><g fill=\"#555\" text-anchor=\"end\">";
  for (double t : yt) {
    const double y = y1 - (t - yr.lo) / (yr.hi - yr.lo) * (y1 - y0);
    o << "<text x=\"" << px(x0 - 4) << "\" y=\"" << px(y + 4) << "\">" << fixed(t, yd) << "</text>";
  }
  o << "</g><g fill=\"#555\" text-anchor=\"middle\">";
  for (double t : xt) {
    const double x = x0 + (t - xr.lo) / (xr.hi - xr.lo) * (x1 - x0);
    o << "<text x=\"" << px(x) << "\" y=\"" << px(y1 + 14) << "\">" << fixed(t, xd) << "</text>";
  }
  o << "</g><path d=\"M" << px(x0) << " " << px(y0) << "V" << px(y1) << "H" << px(x1)
    << "\" fill=\"none\" stroke=\"#888\"/>";
  o << "<text x=\"" << px((x0 + x1) / 2) << "\" y=\"" << px(y1 + 30) << "\" text-anchor=\"middle\" fill=\"#333\">"
    << escape(x_label) << "</text>";
  o << "<text transform=\"translate(12 " << px((y0 + y1) / 2) << ") rotate(-90)\" text-anchor=\"middle\" fill=\"#333\">"
    << escape(y_label) << "</text>";
}

// Bucket means when a series is longer than kMaxLinePoints (NaNs skipped; an all-NaN bucket stays NaN).
Series decimate(const Series& s) {
  const size_t n = std::min(s.x.size(), s.y.size());
  if (n <= kMaxLinePoints) return s;
  Series out;
  out.name = s.name;
  out.color_index = s.color_index;
  out.faint = s.faint;
  out.in_legend = s.in_legend;
  for (size_t b = 0; b < kMaxLinePoints; ++b) {
    const size_t lo = b * n / kMaxLinePoints, hi = (b + 1) * n / kMaxLinePoints;
    double sx = 0, sy = 0;
    size_t k = 0;
    for (size_t i = lo; i < hi; ++i) {
      if (!std::isfinite(s.y[i])) continue;
      sx += s.x[i];
      sy += s.y[i];
      ++k;
    }
    out.x.push_back(k ? sx / static_cast<double>(k) : s.x[lo]);
    out.y.push_back(k ? sy / static_cast<double>(k) : std::nan(""));
  }
  return out;
}

}  // namespace

const char* color(size_t i) {
  return kPalette[i % 10];
}

std::string escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string shorten_label(const std::string& label, size_t max_chars) {
  if (label.size() <= max_chars || max_chars < 8) return label;
  std::string suffix;  // " ×27", " ×27 [rest]"
  const size_t times = label.rfind(" \u00d7");
  if (times != std::string::npos && label.size() - times <= 16) suffix = label.substr(times);
  const std::string ellipsis = "\u2026";
  size_t keep = max_chars > suffix.size() + ellipsis.size() + 4 ? max_chars - suffix.size() - ellipsis.size() : 4;
  while (keep > 0 && (static_cast<unsigned char>(label[keep]) & 0xC0) == 0x80) --keep;  // not inside a character
  return label.substr(0, keep) + ellipsis + suffix;
}

std::vector<double> nice_ticks(double lo, double hi, int target) {
  if (!(hi > lo)) return {lo};
  const double raw = (hi - lo) / std::max(1, target);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * mag;
    if (step >= raw) break;
  }
  std::vector<double> t;
  const double first = std::floor(lo / step + 1e-9) * step;
  for (double v = first; v < hi + step * 0.999; v += step) {
    t.push_back(std::fabs(v) < step * 1e-9 ? 0.0 : v);  // no "-0" from rounding
    if (t.size() > 50) break;
  }
  return t;
}

std::string line_chart(const LineChart& c) {
  std::vector<Series> series;
  for (const auto& s : c.series) series.push_back(decimate(s));
  std::vector<double> xs, ys;
  std::vector<std::string> names;
  std::vector<size_t> colors;
  auto color_of = [&](size_t i) { return series[i].color_index >= 0 ? static_cast<size_t>(series[i].color_index) : i; };
  for (size_t i = 0; i < series.size(); ++i) {
    const Series& s = series[i];
    xs.insert(xs.end(), s.x.begin(), s.x.end());
    ys.insert(ys.end(), s.y.begin(), s.y.end());
    if (!s.in_legend) continue;
    names.push_back(s.name);
    colors.push_back(color_of(i));
  }
  const double x0 = 64, x1 = c.width - 16.0;
  const double y0 = 30 + 14 * legend_rows(names, x0, x1) + 6, y1 = c.height - 40.0;
  const Range xr = fit_range(xs, false), yr = fit_range(ys, c.y_from_zero);

  std::ostringstream o;
  open_svg(o, c.width, c.height, c.title);
  legend(o, names, x0, 32, x1, colors);
  axes(o, x0, x1, y0, y1, xr, yr, c.x_label, c.y_label);
  for (size_t i = 0; i < series.size(); ++i) {
    const Series& s = series[i];
    std::string d;
    bool pen_down = false;
    for (size_t k = 0; k < std::min(s.x.size(), s.y.size()); ++k) {
      if (!std::isfinite(s.y[k]) || !std::isfinite(s.x[k])) {
        pen_down = false;
        continue;
      }
      const double x = x0 + (s.x[k] - xr.lo) / (xr.hi - xr.lo) * (x1 - x0);
      const double y = y1 - (s.y[k] - yr.lo) / (yr.hi - yr.lo) * (y1 - y0);
      d += (pen_down ? "L" : "M") + px(x) + " " + px(y);
      pen_down = true;
    }
    o << "<path class=\"series\" d=\"" << d << "\" fill=\"none\" stroke=\"" << color(color_of(i))
      << (s.faint ? "\" stroke-opacity=\"0.3\" stroke-width=\"1\"><title>" : "\" stroke-width=\"1.5\"><title>")
      << escape(s.name) << "</title></path>";
  }
  o << "</svg>";
  return o.str();
}

std::string bar_chart(const BarChart& c) {
  // Labels get the room they need, the chart growing up to kMaxBarChartWidth while the bars keep at least 300 px.
  size_t max_label = 0;
  for (const auto& b : c.bars) max_label = std::max(max_label, b.label.size());
  const double max_label_w = std::max(360.0, kMaxBarChartWidth - 64.0 - 300.0 - 4.0);
  const double label_w = std::clamp(kCharWidth * static_cast<double>(max_label) + 8, 60.0, max_label_w);
  const size_t label_chars = static_cast<size_t>((label_w - 8) / kCharWidth);
  const int width = std::clamp(static_cast<int>(label_w + 4 + 300 + 64), c.width, std::max(c.width, kMaxBarChartWidth));
  const double x0 = label_w + 4, x1 = width - 64.0;
  const bool stacked = c.components.size() > 1;
  const double y0 = 30 + (stacked ? 14 * legend_rows(c.components, x0, x1) : 0) + 4;
  const double row = 18;
  const double y1 = y0 + row * static_cast<double>(c.bars.size());
  const int height = static_cast<int>(y1 + 40);

  std::vector<double> totals;
  for (const auto& b : c.bars) {
    double t = 0;
    for (double v : b.values) t += std::isfinite(v) ? std::max(v, 0.0) : 0.0;
    totals.push_back(t);
  }
  if (c.reference) totals.push_back(*c.reference);
  const Range xr = fit_range(totals, true);
  if (c.reference) totals.pop_back();
  const std::vector<double>& xt = xr.ticks;
  const auto sx = [&](double v) { return x0 + (v - xr.lo) / (xr.hi - xr.lo) * (x1 - x0); };

  std::ostringstream o;
  open_svg(o, width, height, c.title);
  if (stacked) legend(o, c.components, x0, 32, x1);
  const int xd = tick_digits(xt);
  o << "<g stroke=\"#e4e4e4\">";
  for (double t : xt)
    o << "<line x1=\"" << px(sx(t)) << "\" y1=\"" << px(y0) << "\" x2=\"" << px(sx(t)) << "\" y2=\"" << px(y1)
      << "\"/>";
  o << "</g><g fill=\"#555\" text-anchor=\"middle\">";
  for (double t : xt) o << "<text x=\"" << px(sx(t)) << "\" y=\"" << px(y1 + 14) << "\">" << fixed(t, xd) << "</text>";
  o << "</g><text x=\"" << px((x0 + x1) / 2) << "\" y=\"" << px(y1 + 30) << "\" text-anchor=\"middle\" fill=\"#333\">"
    << escape(c.value_label) << "</text>";
  for (size_t i = 0; i < c.bars.size(); ++i) {
    const Bar& b = c.bars[i];
    const double y = y0 + row * static_cast<double>(i);
    o << "<g class=\"bar\"><title>" << escape(b.label) << ": " << fixed(totals[i], c.value_digits) << "</title>";
    o << "<text x=\"" << px(label_w) << "\" y=\"" << px(y + 13) << "\" text-anchor=\"end\" fill=\"#333\">"
      << escape(shorten_label(b.label, label_chars)) << "</text>";
    double acc = 0;
    for (size_t k = 0; k < b.values.size(); ++k) {
      const double v = std::isfinite(b.values[k]) ? std::max(b.values[k], 0.0) : 0.0;
      if (v <= 0) continue;
      o << "<rect x=\"" << px(sx(acc)) << "\" y=\"" << px(y + 3) << "\" width=\"" << px(sx(acc + v) - sx(acc))
        << "\" height=\"12\" fill=\"" << color(k) << "\"/>";
      acc += v;
    }
    o << "<text x=\"" << px(sx(acc) + 4) << "\" y=\"" << px(y + 13) << "\" fill=\"#555\">"
      << fixed(totals[i], c.value_digits) << "</text></g>";
  }
  o << "<line x1=\"" << px(x0) << "\" y1=\"" << px(y0) << "\" x2=\"" << px(x0) << "\" y2=\"" << px(y1)
    << "\" stroke=\"#888\"/>";
  if (c.reference) {
    const double x = sx(*c.reference);
    o << "<line x1=\"" << px(x) << "\" y1=\"" << px(y0 - 4) << "\" x2=\"" << px(x) << "\" y2=\"" << px(y1)
      << "\" stroke=\"#c00\" stroke-dasharray=\"4 3\"/><text x=\"" << px(x + 3) << "\" y=\"" << px(y0 - 6)
      << "\" fill=\"#c00\">" << escape(c.reference_label) << "</text>";
  }
  o << "</svg>";
  return o.str();
}

std::string scatter_chart(const ScatterChart& c) {
  std::vector<double> xs, ys;
  for (const auto& p : c.points) {
    xs.push_back(p.x);
    ys.push_back(p.y);
  }
  if (c.x_limit) xs.push_back(*c.x_limit);
  const double x0 = 64, x1 = c.width - 16.0, y0 = 36, y1 = c.height - 40.0;
  const Range xr = fit_range(xs, false), yr = fit_range(ys, false);
  const auto sx = [&](double v) { return x0 + (v - xr.lo) / (xr.hi - xr.lo) * (x1 - x0); };
  const auto sy = [&](double v) { return y1 - (v - yr.lo) / (yr.hi - yr.lo) * (y1 - y0); };

  std::ostringstream o;
  open_svg(o, c.width, c.height, c.title);
  axes(o, x0, x1, y0, y1, xr, yr, c.x_label, c.y_label);
  if (c.x_limit) {
    o << "<line x1=\"" << px(sx(*c.x_limit)) << "\" y1=\"" << px(y0) << "\" x2=\"" << px(sx(*c.x_limit)) << "\" y2=\""
      << px(y1) << "\" stroke=\"#c00\" stroke-dasharray=\"4 3\"/><text x=\"" << px(sx(*c.x_limit) - 3) << "\" y=\""
      << px(y0 + 10) << "\" text-anchor=\"end\" fill=\"#c00\">" << escape(c.x_limit_label) << "</text>";
  }
  for (size_t i = 0; i < c.points.size(); ++i) {
    const Point& p = c.points[i];
    if (!std::isfinite(p.x) || !std::isfinite(p.y)) continue;
    o << "<g class=\"point\"><title>" << (i + 1) << ". " << escape(p.label) << "</title><circle cx=\"" << px(sx(p.x))
      << "\" cy=\"" << px(sy(p.y)) << "\" r=\"" << (p.highlight ? 6 : 4) << "\" fill=\""
      << (p.highlight ? "#e15759" : "#4e79a7") << "\" fill-opacity=\"0.85\" stroke=\"#222\" stroke-width=\""
      << (p.highlight ? "1.5" : "0.5") << "\"/><text x=\"" << px(sx(p.x) + 8) << "\" y=\"" << px(sy(p.y) - 6)
      << "\" fill=\"#333\"" << (p.highlight ? " font-weight=\"bold\"" : "") << ">" << (i + 1)
      << (p.highlight ? " (chosen)" : "") << "</text></g>";
  }
  o << "</svg>";
  return o.str();
}

}  // namespace vlatune::reports::svg
