#include "formats/json_cursor.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "formats/json_error.h"

namespace vlatune::formats {

namespace {

// Levenshtein distance, for "did you mean" hints on unknown keys (keys are short; O(n*m) is nothing).
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// 0 rather than 0.0 in "expected ... >= 0".
std::string format_number(double x) {
  if (x == std::floor(x) && std::fabs(x) < 1e15) return std::to_string(static_cast<int64_t>(x));
  return nlohmann::json(x).dump();
}

std::string bound_text(int64_t min, int64_t max) {
  const bool has_min = min != std::numeric_limits<int64_t>::min();
  const bool has_max = max != std::numeric_limits<int64_t>::max();
  if (has_min && has_max) return " in " + std::to_string(min) + ".." + std::to_string(max);
  if (has_min) return " >= " + std::to_string(min);
  if (has_max) return " <= " + std::to_string(max);
  return "";
}

}  // namespace

std::string describe_json(const nlohmann::json& value) {
  switch (value.type()) {
    case nlohmann::json::value_t::null:
      return "null";
    case nlohmann::json::value_t::object:
      return "an object";
    case nlohmann::json::value_t::array:
      return "an array";
    case nlohmann::json::value_t::string: {
      std::string s = value.dump();
      if (s.size() > 60) s = s.substr(0, 57) + "...\"";
      return "string " + s;
    }
    case nlohmann::json::value_t::number_float: {
      const double x = value.get<double>();
      if (std::isnan(x)) return "NaN";
      if (std::isinf(x)) return x > 0 ? "Infinity" : "-Infinity";
      return value.dump();
    }
    default:
      return value.dump();
  }
}

JsonCursor::JsonCursor(const nlohmann::json& value, const std::string& file, std::string path)
    : value_(&value), file_(&file), path_(std::move(path)) {}

void JsonCursor::fail(const std::string& reason) const {
  throw FormatError(*file_, path_, reason);
}

void JsonCursor::expect_object(std::initializer_list<const char*> allowed_keys) const {
  if (!value_->is_object()) fail("expected an object, got " + describe_json(*value_));
  for (const auto& item : value_->items()) {
    const std::string& key = item.key();
    if (std::any_of(allowed_keys.begin(), allowed_keys.end(), [&](const char* k) { return key == k; })) continue;
    std::string expected, hint;
    size_t best = std::max<size_t>(2, key.size() / 3) + 1;
    for (const char* k : allowed_keys) {
      expected += (expected.empty() ? "" : ", ") + std::string(k);
      const size_t d = edit_distance(key, k);
      if (d < best) {
        best = d;
        hint = std::string("; did you mean '") + k + "'?";
      }
    }
    if (allowed_keys.size() == 0) expected = "no keys";
    throw FormatError(*file_, path_ + "." + key, "unknown key (expected one of: " + expected + hint + ")");
  }
}

std::optional<JsonCursor> JsonCursor::find(const char* key) const {
  const auto it = value_->find(key);
  if (it == value_->end()) return std::nullopt;
  return JsonCursor(*it, *file_, path_ + "." + key);
}

JsonCursor JsonCursor::at(const char* key) const {
  auto member = find(key);
  if (!member) throw FormatError(*file_, path_ + "." + key, "missing required key");
  return *member;
}

size_t JsonCursor::expect_array() const {
  if (!value_->is_array()) fail("expected an array, got " + describe_json(*value_));
  return value_->size();
}

JsonCursor JsonCursor::element(size_t i) const {
  return JsonCursor((*value_)[i], *file_, path_ + "[" + std::to_string(i) + "]");
}

std::string JsonCursor::get_string() const {
  if (!value_->is_string()) fail("expected a string, got " + describe_json(*value_));
  return value_->get<std::string>();
}

std::string JsonCursor::get_nonempty_string() const {
  if (!value_->is_string()) fail("expected a non-empty string, got " + describe_json(*value_));
  std::string s = value_->get<std::string>();
  if (s.empty()) fail("expected a non-empty string, got \"\"");
  return s;
}

bool JsonCursor::get_bool() const {
  if (!value_->is_boolean()) fail("expected true or false, got " + describe_json(*value_));
  return value_->get<bool>();
}

int64_t JsonCursor::get_int(int64_t min, int64_t max) const {
  return int_in_range(min, max, false);
}

int64_t JsonCursor::int_in_range(int64_t min, int64_t max, bool nullable) const {
  const std::string expected = "expected an integer" + bound_text(min, max) + (nullable ? " or null" : "") + ", got ";
  int64_t x = 0;
  if (value_->is_number_unsigned()) {
    const uint64_t u = value_->get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) fail(expected + value_->dump());
    x = static_cast<int64_t>(u);
  } else if (value_->is_number_integer()) {
    x = value_->get<int64_t>();
  } else {
    fail(expected + describe_json(*value_));
  }
  if (x < min || x > max) fail(expected + std::to_string(x));
  return x;
}

double JsonCursor::get_number(double min) const {
  return number_at_least(min, false);
}

double JsonCursor::number_at_least(double min, bool nullable) const {
  std::string expected = "expected a finite number";
  if (std::isfinite(min)) expected += " >= " + format_number(min);
  expected += nullable ? " or null, got " : ", got ";
  if (!value_->is_number()) fail(expected + describe_json(*value_));
  const double x = value_->get<double>();
  if (!std::isfinite(x) || x < min) fail(expected + describe_json(*value_));
  return x;
}

std::string JsonCursor::get_enum(std::initializer_list<const char*> values) const {
  std::string expected;
  for (const char* v : values) expected += (expected.empty() ? "\"" : ", \"") + std::string(v) + "\"";
  expected = "expected one of " + expected + ", got ";
  if (!value_->is_string()) fail(expected + describe_json(*value_));
  const std::string s = value_->get<std::string>();
  if (std::none_of(values.begin(), values.end(), [&](const char* v) { return s == v; })) {
    fail(expected + describe_json(*value_));
  }
  return s;
}

std::optional<std::string> JsonCursor::get_optional_string() const {
  if (value_->is_null()) return std::nullopt;
  if (!value_->is_string()) fail("expected a string or null, got " + describe_json(*value_));
  return value_->get<std::string>();
}

std::optional<int64_t> JsonCursor::get_optional_int(int64_t min, int64_t max) const {
  if (value_->is_null()) return std::nullopt;
  return int_in_range(min, max, true);
}

std::optional<double> JsonCursor::get_optional_number(double min) const {
  if (value_->is_null()) return std::nullopt;
  return number_at_least(min, true);
}

}  // namespace vlatune::formats
