#include "trainer/parquet_table.h"

#include <sys/stat.h>

#include <cmath>

#if defined(VLATUNE_HAVE_ARROW)
#include <arrow/api.h>
#include <arrow/io/file.h>
#include <arrow/util/config.h>
#include <parquet/arrow/reader.h>
#include <parquet/arrow/schema.h>
#include <parquet/exception.h>
#include <parquet/file_reader.h>
#endif

namespace vlatune::trainer {

#if !defined(VLATUNE_HAVE_ARROW)

struct ParquetTable::Impl {};

bool ParquetTable::available() {
  return false;
}
ParquetTable::ParquetTable(const std::string& path) : path_(path) {
  throw std::runtime_error(path + ": cannot read parquet: vlatune was built without Arrow/Parquet (pyarrow)");
}
ParquetTable::~ParquetTable() = default;
int64_t ParquetTable::rows() const {
  return 0;
}
bool ParquetTable::has_column(const std::string&) const {
  return false;
}
std::vector<std::string> ParquetTable::column_names() const {
  return {};
}
std::vector<std::pair<int64_t, int64_t> > ParquetTable::row_groups() const {
  return {};
}
std::vector<int64_t> ParquetTable::int_column(const std::string&) const {
  return {};
}
std::vector<double> ParquetTable::float_column(const std::string&, bool) const {
  return {};
}
std::vector<std::string> ParquetTable::string_column(const std::string&) const {
  return {};
}
std::vector<std::vector<std::string> > ParquetTable::string_list_column(const std::string&) const {
  return {};
}
std::vector<float> ParquetTable::vector_column(const std::string&, int64_t) const {
  return {};
}
std::vector<ParquetTable::ImageCell> ParquetTable::image_cells(const std::string&, int64_t, int64_t) const {
  return {};
}

#else

namespace {

// Arrow 24 deprecated the Status-returning readers in favour of Result; older wheels have only the former.
std::shared_ptr<arrow::Table> read_row_groups(parquet::arrow::FileReader& reader, const std::vector<int>& groups,
                                              const std::vector<int>& leaves, const std::string& file) {
  std::shared_ptr<arrow::Table> table;
#if ARROW_VERSION_MAJOR >= 24
  auto result = reader.ReadRowGroups(groups, leaves);
  if (!result.ok()) throw DataError(file + ": cannot read: " + result.status().ToString());
  table = *result;
#else
  const auto status = reader.ReadRowGroups(groups, leaves, &table);
  if (!status.ok()) throw DataError(file + ": cannot read: " + status.ToString());
#endif
  return table;
}

void collect_leaves(const parquet::arrow::SchemaField& field, std::vector<int>& out) {
  if (field.is_leaf()) out.push_back(field.column_index);
  for (const auto& child : field.children) collect_leaves(child, out);
}

bool int_type(const arrow::DataType& t) {
  return arrow::is_integer(t.id());
}

bool float_type(const arrow::DataType& t) {
  return t.id() == arrow::Type::FLOAT || t.id() == arrow::Type::DOUBLE;
}

int64_t integer_at(const arrow::Array& a, int64_t i) {
  switch (a.type_id()) {
    case arrow::Type::INT8:
      return static_cast<const arrow::Int8Array&>(a).Value(i);
    case arrow::Type::INT16:
      return static_cast<const arrow::Int16Array&>(a).Value(i);
    case arrow::Type::INT32:
      return static_cast<const arrow::Int32Array&>(a).Value(i);
    case arrow::Type::INT64:
      return static_cast<const arrow::Int64Array&>(a).Value(i);
    case arrow::Type::UINT8:
      return static_cast<const arrow::UInt8Array&>(a).Value(i);
    case arrow::Type::UINT16:
      return static_cast<const arrow::UInt16Array&>(a).Value(i);
    case arrow::Type::UINT32:
      return static_cast<const arrow::UInt32Array&>(a).Value(i);
    case arrow::Type::UINT64: {
      const uint64_t v = static_cast<const arrow::UInt64Array&>(a).Value(i);
      if (v > static_cast<uint64_t>(INT64_MAX)) throw std::out_of_range("value " + std::to_string(v));
      return static_cast<int64_t>(v);
    }
    default:
      throw std::logic_error("integer_at: not an integer array");
  }
}

double float_at(const arrow::Array& a, int64_t i) {
  if (a.type_id() == arrow::Type::FLOAT) return static_cast<const arrow::FloatArray&>(a).Value(i);
  return static_cast<const arrow::DoubleArray&>(a).Value(i);
}

std::string string_at(const arrow::Array& a, int64_t i) {
  if (a.type_id() == arrow::Type::STRING) return static_cast<const arrow::StringArray&>(a).GetString(i);
  return static_cast<const arrow::LargeStringArray&>(a).GetString(i);
}

bool string_type(const arrow::DataType& t) {
  return t.id() == arrow::Type::STRING || t.id() == arrow::Type::LARGE_STRING;
}

bool binary_type(const arrow::DataType& t) {
  return t.id() == arrow::Type::BINARY || t.id() == arrow::Type::LARGE_BINARY;
}

// The values child and the [begin, end) of row i of a list-like array.
struct ListRow {
  std::shared_ptr<arrow::Array> values;
  int64_t begin = 0, end = 0;
};

bool list_type(const arrow::DataType& t) {
  return t.id() == arrow::Type::LIST || t.id() == arrow::Type::LARGE_LIST || t.id() == arrow::Type::FIXED_SIZE_LIST;
}

ListRow list_row(const arrow::Array& a, int64_t i) {
  switch (a.type_id()) {
    case arrow::Type::LIST: {
      const auto& l = static_cast<const arrow::ListArray&>(a);
      return {l.values(), l.value_offset(i), l.value_offset(i) + l.value_length(i)};
    }
    case arrow::Type::LARGE_LIST: {
      const auto& l = static_cast<const arrow::LargeListArray&>(a);
      return {l.values(), l.value_offset(i), l.value_offset(i) + l.value_length(i)};
    }
    case arrow::Type::FIXED_SIZE_LIST: {
      const auto& l = static_cast<const arrow::FixedSizeListArray&>(a);
      return {l.values(), l.value_offset(i), l.value_offset(i) + l.value_length(i)};
    }
    default:
      throw std::logic_error("list_row: not a list array");
  }
}

}  // namespace

struct ParquetTable::Impl {
  std::unique_ptr<parquet::arrow::FileReader> reader;
  std::shared_ptr<arrow::Schema> schema;
  std::vector<std::pair<int64_t, int64_t> > groups;
  int64_t rows = 0;

  [[noreturn]] void fail(const std::string& file, const std::string& column, const std::string& what) const {
    throw DataError(file + ": column '" + column + "': " + what);
  }

  int field_index(const std::string& file, const std::string& name) const {
    const int i = schema->GetFieldIndex(name);
    if (i < 0) {
      std::string have;
      for (const auto& f : schema->fields()) have += (have.empty() ? "" : ", ") + f->name();
      throw DataError(file + ": no column '" + name + "' (columns: " + have + ")");
    }
    return i;
  }

  // The column as one array per row group read; rows concatenated in order.
  std::vector<std::shared_ptr<arrow::Array> > read(const std::string& file, const std::string& name,
                                                   const std::vector<int>& row_groups) const {
    const int fi = field_index(file, name);
    std::vector<int> leaves;
    collect_leaves(reader->manifest().schema_fields[static_cast<size_t>(fi)], leaves);
    std::vector<int> groups_to_read = row_groups;
    if (groups_to_read.empty())
      for (int g = 0; g < static_cast<int>(groups.size()); ++g) groups_to_read.push_back(g);
    std::vector<std::shared_ptr<arrow::Array> > chunks;
    if (groups_to_read.empty()) return chunks;
    std::shared_ptr<arrow::Table> table;
    try {
      table = read_row_groups(*reader, groups_to_read, leaves, file);
    } catch (const parquet::ParquetException& e) {
      throw DataError(file + ": cannot read column '" + name + "': " + e.what());
    }
    auto column = table->GetColumnByName(name);
    if (!column) fail(file, name, "missing after reading");
    for (const auto& c : column->chunks()) chunks.push_back(c);
    return chunks;
  }
};

bool ParquetTable::available() {
  return true;
}

ParquetTable::ParquetTable(const std::string& path) : impl_(std::make_unique<Impl>()), path_(path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw DataError(path + ": missing (a parquet file the dataset lists)");
  if (!S_ISREG(st.st_mode)) throw DataError(path + ": not a regular file");
  try {
    parquet::arrow::FileReaderBuilder builder;
    auto status = builder.OpenFile(path, /*memory_map=*/false);
    if (!status.ok()) throw DataError(path + ": not a readable parquet file (truncated?): " + status.ToString());
    status = builder.Build(&impl_->reader);
    if (!status.ok()) throw DataError(path + ": not a readable parquet file: " + status.ToString());
    status = impl_->reader->GetSchema(&impl_->schema);
    if (!status.ok()) throw DataError(path + ": cannot read the schema: " + status.ToString());
    auto meta = impl_->reader->parquet_reader()->metadata();
    int64_t first = 0;
    for (int g = 0; g < meta->num_row_groups(); ++g) {
      const int64_t n = meta->RowGroup(g)->num_rows();
      impl_->groups.emplace_back(first, n);
      first += n;
    }
    impl_->rows = first;
  } catch (const parquet::ParquetException& e) {
    throw DataError(path + ": not a readable parquet file (truncated?): " + e.what());
  }
}

ParquetTable::~ParquetTable() = default;

int64_t ParquetTable::rows() const {
  return impl_->rows;
}

bool ParquetTable::has_column(const std::string& name) const {
  return impl_->schema->GetFieldIndex(name) >= 0;
}

std::vector<std::string> ParquetTable::column_names() const {
  std::vector<std::string> names;
  for (const auto& f : impl_->schema->fields()) names.push_back(f->name());
  return names;
}

std::vector<std::pair<int64_t, int64_t> > ParquetTable::row_groups() const {
  return impl_->groups;
}

std::vector<int64_t> ParquetTable::int_column(const std::string& name) const {
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(impl_->rows));
  for (const auto& a : impl_->read(path_, name, {})) {
    if (!int_type(*a->type())) impl_->fail(path_, name, "expected integers, found " + a->type()->ToString());
    for (int64_t i = 0; i < a->length(); ++i) {
      const int64_t row = static_cast<int64_t>(out.size());
      if (a->IsNull(i)) impl_->fail(path_, name, "row " + std::to_string(row) + " is null");
      try {
        out.push_back(integer_at(*a, i));
      } catch (const std::out_of_range& e) {
        impl_->fail(path_, name, "row " + std::to_string(row) + ": " + e.what() + " is out of range");
      }
    }
  }
  return out;
}

std::vector<double> ParquetTable::float_column(const std::string& name, bool finite) const {
  std::vector<double> out;
  out.reserve(static_cast<size_t>(impl_->rows));
  for (const auto& a : impl_->read(path_, name, {})) {
    if (!float_type(*a->type())) impl_->fail(path_, name, "expected float32/float64, found " + a->type()->ToString());
    for (int64_t i = 0; i < a->length(); ++i) {
      const int64_t row = static_cast<int64_t>(out.size());
      if (a->IsNull(i)) impl_->fail(path_, name, "row " + std::to_string(row) + " is null");
      const double v = float_at(*a, i);
      if (finite && !std::isfinite(v)) impl_->fail(path_, name, "row " + std::to_string(row) + " is not finite");
      out.push_back(v);
    }
  }
  return out;
}

std::vector<std::string> ParquetTable::string_column(const std::string& name) const {
  std::vector<std::string> out;
  for (const auto& a : impl_->read(path_, name, {})) {
    if (!string_type(*a->type())) impl_->fail(path_, name, "expected strings, found " + a->type()->ToString());
    for (int64_t i = 0; i < a->length(); ++i) {
      if (a->IsNull(i)) impl_->fail(path_, name, "row " + std::to_string(out.size()) + " is null");
      out.push_back(string_at(*a, i));
    }
  }
  return out;
}

std::vector<std::vector<std::string> > ParquetTable::string_list_column(const std::string& name) const {
  std::vector<std::vector<std::string> > out;
  for (const auto& a : impl_->read(path_, name, {})) {
    if (!list_type(*a->type())) impl_->fail(path_, name, "expected a list of strings, found " + a->type()->ToString());
    for (int64_t i = 0; i < a->length(); ++i) {
      const std::string row = "row " + std::to_string(out.size());
      if (a->IsNull(i)) impl_->fail(path_, name, row + " is null");
      const auto r = list_row(*a, i);
      if (!string_type(*r.values->type()))
        impl_->fail(path_, name, "expected a list of strings, found " + a->type()->ToString());
      std::vector<std::string> items;
      for (int64_t k = r.begin; k < r.end; ++k) {
        if (r.values->IsNull(k)) impl_->fail(path_, name, row + " holds a null string");
        items.push_back(string_at(*r.values, k));
      }
      out.push_back(std::move(items));
    }
  }
  return out;
}

std::vector<float> ParquetTable::vector_column(const std::string& name, int64_t width) const {
  std::vector<float> out;
  out.reserve(static_cast<size_t>(impl_->rows * width));
  int64_t row = 0;
  for (const auto& a : impl_->read(path_, name, {})) {
    const auto& type = *a->type();
    if (width == 1 && float_type(type)) {
      for (int64_t i = 0; i < a->length(); ++i, ++row) {
        if (a->IsNull(i)) impl_->fail(path_, name, "row " + std::to_string(row) + " is null");
        const double v = float_at(*a, i);
        if (!std::isfinite(v)) impl_->fail(path_, name, "row " + std::to_string(row) + " is not finite");
        out.push_back(static_cast<float>(v));
      }
      continue;
    }
    if (!list_type(type))
      impl_->fail(path_, name,
                  "expected a list of " + std::to_string(width) + " floats per row, found " + type.ToString());
    for (int64_t i = 0; i < a->length(); ++i, ++row) {
      if (a->IsNull(i)) impl_->fail(path_, name, "row " + std::to_string(row) + " is null");
      const auto r = list_row(*a, i);
      if (!float_type(*r.values->type()))
        impl_->fail(path_, name, "expected float32/float64 values, found " + type.ToString());
      if (r.end - r.begin != width)
        impl_->fail(path_, name,
                    "row " + std::to_string(row) + " has " + std::to_string(r.end - r.begin) +
                        " values; the feature's shape says " + std::to_string(width));
      for (int64_t k = r.begin; k < r.end; ++k) {
        if (r.values->IsNull(k)) impl_->fail(path_, name, "row " + std::to_string(row) + " holds a null");
        const double v = float_at(*r.values, k);
        if (!std::isfinite(v))
          impl_->fail(path_, name,
                      "row " + std::to_string(row) + " value " + std::to_string(k - r.begin) + " is not finite");
        out.push_back(static_cast<float>(v));
      }
    }
  }
  return out;
}

std::vector<ParquetTable::ImageCell> ParquetTable::image_cells(const std::string& name, int64_t first,
                                                               int64_t count) const {
  if (first < 0 || count < 0 || first + count > impl_->rows)
    impl_->fail(path_, name,
                "rows [" + std::to_string(first) + ", " + std::to_string(first + count) + ") are outside the file's " +
                    std::to_string(impl_->rows) + " rows");
  std::vector<int> wanted;
  int64_t group_first = -1;
  for (int g = 0; g < static_cast<int>(impl_->groups.size()); ++g) {
    const auto [begin, n] = impl_->groups[static_cast<size_t>(g)];
    if (begin + n <= first || begin >= first + count || n == 0) continue;
    if (group_first < 0) group_first = begin;
    wanted.push_back(g);
  }
  std::vector<ImageCell> out;
  if (wanted.empty()) return out;
  int64_t row = group_first;
  for (const auto& a : impl_->read(path_, name, wanted)) {
    if (a->type_id() != arrow::Type::STRUCT)
      impl_->fail(path_, name, "expected an image struct<bytes, path>, found " + a->type()->ToString());
    const auto& s = static_cast<const arrow::StructArray&>(*a);
    const auto bytes = s.GetFieldByName("bytes");
    const auto paths = s.GetFieldByName("path");
    if (!bytes || !binary_type(*bytes->type()))
      impl_->fail(path_, name, "expected an image struct<bytes: binary, path: string>, found " + a->type()->ToString());
    if (paths && !string_type(*paths->type()))
      impl_->fail(path_, name, "the image struct's 'path' is " + paths->type()->ToString() + ", not a string");
    for (int64_t i = 0; i < a->length(); ++i, ++row) {
      if (row < first || row >= first + count) continue;
      ImageCell cell;
      if (!a->IsNull(i) && !bytes->IsNull(i)) {
        if (bytes->type_id() == arrow::Type::BINARY)
          cell.bytes = static_cast<const arrow::BinaryArray&>(*bytes).GetString(i);
        else
          cell.bytes = static_cast<const arrow::LargeBinaryArray&>(*bytes).GetString(i);
      } else if (paths && !a->IsNull(i) && !paths->IsNull(i)) {
        cell.path = string_at(*paths, i);
      } else {
        impl_->fail(path_, name, "row " + std::to_string(row) + " has neither image bytes nor a path");
      }
      out.push_back(std::move(cell));
    }
  }
  return out;
}

#endif  // VLATUNE_HAVE_ARROW

}  // namespace vlatune::trainer
