// One parquet file of a LeRobot dataset, read through Apache Arrow's C++ library (the one inside the pyarrow
// wheel). Only the column types LeRobot writes are accepted, each converted to a plain vector; every error is a
// DataError naming the file, the column and, where one is at fault, the row.
//
// This header is C++17 and free of Arrow's headers (they need C++20); parquet_table.cpp is the one translation
// unit that includes them. Not thread-safe: each worker opens its own ParquetTable.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "trainer/data_error.h"

namespace vlatune::trainer {

class ParquetTable {
 public:
  // True when this build has Arrow/Parquet.
  static bool available();

  // Opens `path` (a regular file) and reads its footer: schema and row groups. DataError when it is missing, not a
  // regular file, or not parquet (a truncated file fails here: its footer is gone).
  explicit ParquetTable(const std::string& path);
  ~ParquetTable();
  ParquetTable(const ParquetTable&) = delete;
  ParquetTable& operator=(const ParquetTable&) = delete;

  const std::string& path() const { return path_; }
  int64_t rows() const;
  bool has_column(const std::string& name) const;  // a top-level field
  std::vector<std::string> column_names() const;
  // [first row, row count) of each row group, in order.
  std::vector<std::pair<int64_t, int64_t> > row_groups() const;

  // Whole columns. Integers: any integer type (null refused). Floats: float32 or float64 (null or NaN refused
  // where `finite`). Strings: string or large_string.
  std::vector<int64_t> int_column(const std::string& name) const;
  std::vector<double> float_column(const std::string& name, bool finite = true) const;
  std::vector<std::string> string_column(const std::string& name) const;
  // list<string> per row (v3.0 episode rows' "tasks").
  std::vector<std::vector<std::string> > string_list_column(const std::string& name) const;
  // A vector feature: fixed_size_list, list or large_list of float32/float64 with exactly `width` finite values
  // per row (a plain float column when width is 1), as row-major [rows, width] float32.
  std::vector<float> vector_column(const std::string& name, int64_t width) const;

  // An image feature (HF datasets' Image: struct<bytes: binary, path: string>) for rows [first, first + count):
  // the encoded bytes of each row, or, where bytes is null, the stored path (for the caller to resolve).
  // Reads only the row groups that hold those rows.
  struct ImageCell {
    std::string bytes;
    std::string path;
  };
  std::vector<ImageCell> image_cells(const std::string& name, int64_t first, int64_t count) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string path_;
};

}  // namespace vlatune::trainer
