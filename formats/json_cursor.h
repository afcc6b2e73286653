// JsonCursor: a read-only view of one JSON value plus the file and the JSON path that lead to it. The validating
// readers walk documents with it, so every type, range and unknown-key error carries "file: $.path: reason" and
// says what was expected and what was found:
//   recipe.json: $.batch.micro_batch: expected an integer >= 1, got 0
//   recipe.json: $.batch.micro_bach: unknown key (expected one of: micro_batch, grad_accum; did you mean
//   'micro_batch'?)
// Paths use `.key` for members and `[i]` for array elements, rooted at `$`.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace vlatune::formats {

class JsonCursor {
 public:
  // `file` must outlive the cursor (readers hold it for the whole parse).
  JsonCursor(const nlohmann::json& value, const std::string& file, std::string path = "$");

  const nlohmann::json& value() const { return *value_; }
  const std::string& path() const { return path_; }
  const std::string& file() const { return *file_; }

  // Throws FormatError(file, path, reason).
  [[noreturn]] void fail(const std::string& reason) const;

  // Objects. expect_object checks the type and rejects keys outside `allowed_keys` (with a spelling hint).
  void expect_object(std::initializer_list<const char*> allowed_keys) const;
  // The member, or nullopt when absent (the value must be an object: call expect_object first).
  std::optional<JsonCursor> find(const char* key) const;
  // The member; absent -> FormatError at path.key: "missing required key".
  JsonCursor at(const char* key) const;

  // Arrays: expect_array checks the type and returns the length; element(i) has path[i].
  size_t expect_array() const;
  JsonCursor element(size_t i) const;

  // Scalars. Each checks the JSON type strictly (no "32" for 32, no 32.0 for an integer, no 1 for true).
  bool is_null() const { return value_->is_null(); }
  std::string get_string() const;
  std::string get_nonempty_string() const;
  bool get_bool() const;
  int64_t get_int(int64_t min = std::numeric_limits<int64_t>::min(),
                  int64_t max = std::numeric_limits<int64_t>::max()) const;
  // A finite JSON number (integer or floating) >= min.
  double get_number(double min = -std::numeric_limits<double>::infinity()) const;
  // One of `values`, e.g. get_enum({"lean", "materialized"}).
  std::string get_enum(std::initializer_list<const char*> values) const;

  // Nullable variants: JSON null -> nullopt.
  std::optional<std::string> get_optional_string() const;
  std::optional<int64_t> get_optional_int(int64_t min = std::numeric_limits<int64_t>::min(),
                                          int64_t max = std::numeric_limits<int64_t>::max()) const;
  std::optional<double> get_optional_number(double min = -std::numeric_limits<double>::infinity()) const;

 private:
  int64_t int_in_range(int64_t min, int64_t max, bool nullable) const;
  double number_at_least(double min, bool nullable) const;

  const nlohmann::json* value_;
  const std::string* file_;
  std::string path_;
};

// A short description of a JSON value for error messages: `string "32"`, `32.5`, `an object`, `null`.
std::string describe_json(const nlohmann::json& value);

}  // namespace vlatune::formats
