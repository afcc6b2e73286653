#include "trainer/norm_stats.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "formats/json_cursor.h"
#include "formats/json_io.h"

namespace vlatune::trainer {

namespace {

double linear_quantile(const std::vector<float>& sorted, double p) {
  const double h = static_cast<double>(sorted.size() - 1) * p;
  const auto lo = static_cast<size_t>(std::floor(h));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (h - static_cast<double>(lo)) * (static_cast<double>(sorted[hi]) - sorted[lo]);
}

}  // namespace

QuantileStats compute_quantiles(const std::vector<float>& values, int64_t dim) {
  if (dim < 1 || values.empty() || values.size() % static_cast<size_t>(dim) != 0)
    throw std::invalid_argument("compute_quantiles: need a non-empty [rows, " + std::to_string(dim) + "] array, got " +
                                std::to_string(values.size()) + " values");
  const size_t rows = values.size() / static_cast<size_t>(dim);
  QuantileStats stats;
  std::vector<float> column(rows);
  for (int64_t d = 0; d < dim; ++d) {
    for (size_t r = 0; r < rows; ++r) column[r] = values[r * static_cast<size_t>(dim) + static_cast<size_t>(d)];
    std::sort(column.begin(), column.end());
    stats.q01.push_back(static_cast<float>(linear_quantile(column, 0.01)));
    stats.q99.push_back(static_cast<float>(linear_quantile(column, 0.99)));
  }
  return stats;
}

QuantileStats compute_norm_stats(const std::vector<float>& values, int64_t dim, const std::vector<int64_t>& weights) {
  if (dim < 1 || values.empty() || values.size() % static_cast<size_t>(dim) != 0)
    throw std::invalid_argument("compute_norm_stats: need a non-empty [rows, " + std::to_string(dim) + "] array, got " +
                                std::to_string(values.size()) + " values");
  const size_t rows = values.size() / static_cast<size_t>(dim);
  if (!weights.empty() && weights.size() != rows)
    throw std::invalid_argument("compute_norm_stats: " + std::to_string(weights.size()) + " weights for " +
                                std::to_string(rows) + " rows");
  auto weight = [&](size_t r) { return weights.empty() ? int64_t{1} : weights[r]; };
  int64_t total = 0;
  for (size_t r = 0; r < rows; ++r) {
    if (weight(r) < 0) throw std::invalid_argument("compute_norm_stats: negative weight at row " + std::to_string(r));
    total += weight(r);
  }
  if (total == 0) throw std::invalid_argument("compute_norm_stats: the weights sum to zero");
  QuantileStats stats;
  std::vector<std::pair<float, int64_t> > column(rows);
  for (int64_t d = 0; d < dim; ++d) {
    double sum = 0, sum_sq = 0;
    for (size_t r = 0; r < rows; ++r) {
      const float v = values[r * static_cast<size_t>(dim) + static_cast<size_t>(d)];
      const auto w = static_cast<double>(weight(r));
      sum += w * v;
      sum_sq += w * static_cast<double>(v) * v;
      column[r] = {v, weight(r)};
    }
    const double mean = sum / static_cast<double>(total);
    stats.mean.push_back(static_cast<float>(mean));
    stats.std.push_back(
        static_cast<float>(std::sqrt(std::max(0.0, sum_sq / static_cast<double>(total) - mean * mean))));
    std::sort(column.begin(), column.end());
    // The value at rank k of the rows repeated by their weights.
    auto at_rank = [&](int64_t k) {
      int64_t seen = 0;
      for (const auto& [v, w] : column) {
        seen += w;
        if (k < seen) return static_cast<double>(v);
      }
      return static_cast<double>(column.back().first);
    };
    for (const double p : {0.01, 0.99}) {
      const double h = static_cast<double>(total - 1) * p;
      const auto lo = static_cast<int64_t>(std::floor(h));
      const double a = at_rank(lo), b = at_rank(std::min(lo + 1, total - 1));
      (p < 0.5 ? stats.q01 : stats.q99).push_back(static_cast<float>(a + (h - static_cast<double>(lo)) * (b - a)));
    }
  }
  return stats;
}

namespace {

// f(value, q01, q99) on the first q01.size() dims of every row (the rest, padding, pass through), after checking
// that the statistics fit rows of `dim`; `what` names the caller in the error.
template <typename F>
void map_quantile_dims(const char* what, float* values, int64_t rows, int64_t dim, const QuantileStats& stats, F f) {
  const auto n = static_cast<int64_t>(stats.q01.size());
  if (stats.q99.size() != stats.q01.size() || n > dim)
    throw std::invalid_argument(std::string(what) + ": statistics for " + std::to_string(n) + " dims (q99: " +
                                std::to_string(stats.q99.size()) + ") do not fit rows of " + std::to_string(dim));
  for (int64_t r = 0; r < rows; ++r) {
    float* row = values + r * dim;
    for (int64_t d = 0; d < n; ++d) row[d] = f(row[d], stats.q01[d], stats.q99[d]);
  }
}

}  // namespace

void normalize_quantile(float* values, int64_t rows, int64_t dim, const QuantileStats& stats) {
  map_quantile_dims("normalize_quantile", values, rows, dim, stats, [](float x, double lo, double hi) {
    return static_cast<float>((x - lo) / (hi - lo + 1e-6) * 2.0 - 1.0);
  });
}

void unnormalize_quantile(float* values, int64_t rows, int64_t dim, const QuantileStats& stats) {
  map_quantile_dims("unnormalize_quantile", values, rows, dim, stats, [](float x, double lo, double hi) {
    return static_cast<float>((x + 1.0) / 2.0 * (hi - lo + 1e-6) + lo);
  });
}

nlohmann::json quantile_stats_to_json(const QuantileStats& stats) {
  // Stored as the doubles the floats convert to exactly; nlohmann prints the shortest round-trip form.
  auto as_json = [](const std::vector<float>& v) {
    nlohmann::json a = nlohmann::json::array();
    for (float x : v) a.push_back(static_cast<double>(x));
    return a;
  };
  nlohmann::json j = {{"q01", as_json(stats.q01)}, {"q99", as_json(stats.q99)}};
  if (!stats.mean.empty()) j["mean"] = as_json(stats.mean);
  if (!stats.std.empty()) j["std"] = as_json(stats.std);
  return j;
}

nlohmann::json norm_stats_file_json(const NormStats& stats) {
  return {{"norm_stats",
           {{"actions", quantile_stats_to_json(stats.actions)}, {"state", quantile_stats_to_json(stats.state)}}}};
}

NormStats read_norm_stats_file(const std::string& path) {
  const nlohmann::json j = formats::read_json_file(path);
  const formats::JsonCursor root(j, path);
  root.expect_object({"norm_stats"});
  const formats::JsonCursor stats = root.at("norm_stats");
  stats.expect_object({"actions", "state"});
  auto read = [&](const char* key) {
    const formats::JsonCursor entry = stats.at(key);
    entry.expect_object({"q01", "q99", "mean", "std"});
    const formats::JsonCursor q01 = entry.at("q01");
    const size_t dim = q01.expect_array();
    if (dim == 0) q01.fail("expected at least one value");
    return read_quantile_stats(entry, static_cast<int64_t>(dim));
  };
  NormStats out;
  out.actions = read("actions");
  out.state = read("state");
  return out;
}

QuantileStats read_quantile_stats(const formats::JsonCursor& cursor, int64_t dim) {
  cursor.expect_object({"q01", "q99", "mean", "std"});
  auto read = [&](const char* key) {
    const auto arr = cursor.at(key);
    const size_t n = arr.expect_array();
    if (static_cast<int64_t>(n) != dim)
      arr.fail("expected " + std::to_string(dim) + " values (one per dimension), got " + std::to_string(n));
    std::vector<float> v;
    for (size_t i = 0; i < n; ++i) v.push_back(static_cast<float>(arr.element(i).get_number()));
    return v;
  };
  QuantileStats stats;
  stats.q01 = read("q01");
  stats.q99 = read("q99");
  const bool has_mean = cursor.find("mean").has_value(), has_std = cursor.find("std").has_value();
  if (has_mean != has_std)
    cursor.fail(std::string("has \"") + (has_mean ? "mean" : "std") + "\" without \"" + (has_mean ? "std" : "mean") +
                "\"");
  if (has_mean) {
    stats.mean = read("mean");
    stats.std = read("std");
  }
  return stats;
}

}  // namespace vlatune::trainer
