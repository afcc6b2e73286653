// Quantile normalization statistics of actions and state (spec §5.3): computed at import time, stored in the
// dataset manifest, applied to the stored records, and written out with the final weights so inference can
// unnormalize. pi05 uses quantiles, not mean/std: x~ = (x - q01) / (q99 - q01 + 1e-6) * 2 - 1.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace vlatune::formats {
class JsonCursor;
}

namespace vlatune::trainer {

struct QuantileStats {
  std::vector<float> q01, q99;  // one value per real (unpadded) dimension
  // openpi's NormStats also carries mean and std (its z-score normalization and its loader need them); empty
  // where the dataset's maker did not compute them.
  std::vector<float> mean, std;
};

struct NormStats {
  QuantileStats actions;
  QuantileStats state;
};

// Per-dimension 1% and 99% quantiles of row-major [rows, dim] values, with numpy's default ("linear")
// interpolation: q(p) = v[floor(h)] + (h - floor(h)) * (v[floor(h) + 1] - v[floor(h)]), h = (rows - 1) * p.
// Exact, where openpi's compute_norm_stats approximates with a 5000-bin histogram; the two agree to within a
// bin width. Throws std::invalid_argument when there are no rows or values.size() != rows * dim.
QuantileStats compute_quantiles(const std::vector<float>& values, int64_t dim);

// openpi's compute_norm_stats quantities of row-major [rows, dim] values where row r counts weights[r] times (an
// empty `weights`: once each): mean, std = sqrt(E[x^2] - E[x]^2), and q01/q99 exactly as compute_quantiles would
// give on the rows repeated by their weights (numpy's linear interpolation). openpi approximates the quantiles
// with a 5000-bin histogram per dimension, so its values differ from these by up to one bin width
// ((max - min) / 5000). Throws std::invalid_argument on empty input, a shape mismatch or a zero total weight.
QuantileStats compute_norm_stats(const std::vector<float>& values, int64_t dim, const std::vector<int64_t>& weights);

// Normalizes `rows` rows of `dim` values in place. Dims [0, stats.q01.size()) are mapped with the formula above
// (computed in double, rounded to float once, as numpy does with openpi's float64 statistics); dims beyond the
// statistics pass through unchanged (openpi: "padded dims are passed through"). Throws std::invalid_argument
// when the statistics have more dims than a row or q01/q99 differ in length.
void normalize_quantile(float* values, int64_t rows, int64_t dim, const QuantileStats& stats);

// The inverse of normalize_quantile (openpi's Unnormalize): x = (x~ + 1) / 2 * (q99 - q01 + 1e-6) + q01 on dims
// [0, stats.q01.size()), in double, rounded to float once; other dims pass through. Same errors.
void unnormalize_quantile(float* values, int64_t rows, int64_t dim, const QuantileStats& stats);

// The manifest form: {"q01": [...], "q99": [...]} plus "mean" and "std" when present. Floats are written with
// enough digits to round-trip.
nlohmann::json quantile_stats_to_json(const QuantileStats& stats);
// openpi's norm_stats.json (its assets layout): {"norm_stats": {"actions": {...}, "state": {...}}}.
nlohmann::json norm_stats_file_json(const NormStats& stats);

// Reads openpi's norm_stats.json (norm_stats_file_json's layout; what a run writes to final/): "actions" and
// "state" each with q01 and q99 (mean and std optional) of one length per entry, at least one dim. FormatError
// naming the file and the JSON path.
NormStats read_norm_stats_file(const std::string& path);

// Validating reader: q01 and q99 (mean and std optional, both or neither), finite numbers, `dim` entries each
// (FormatError with the JSON path).
QuantileStats read_quantile_stats(const formats::JsonCursor& cursor, int64_t dim);

}  // namespace vlatune::trainer
