#include "formats/metrics_jsonl.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>

#include "formats/json_cursor.h"
#include "formats/json_error.h"
#include "formats/json_io.h"

namespace vlatune::formats {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

bool same_number(double a, double b) {
  return a == b || (std::isnan(a) && std::isnan(b));
}

nlohmann::json number_or_null(double x) {
  return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr);
}

std::string line_file(const std::string& file, int64_t line) {
  return file + ":" + std::to_string(line);
}

nlohmann::json header_json() {
  return {{"schema", kMetricsSchema}};
}

void parse_header(const nlohmann::json& j, const std::string& file) {
  const JsonCursor root(j, file);
  root.expect_object({"schema"});
  const JsonCursor schema = root.at("schema");
  if (schema.get_string() != kMetricsSchema) {
    schema.fail(std::string("expected \"") + kMetricsSchema + "\", got " + describe_json(schema.value()));
  }
}

struct Line {
  std::string text;
  bool terminated;  // ended with '\n'
};

std::vector<Line> split_lines(const std::string& text) {
  std::vector<Line> out;
  size_t start = 0;
  while (start < text.size()) {
    const size_t nl = text.find('\n', start);
    if (nl == std::string::npos) {
      out.push_back({text.substr(start), false});
      break;
    }
    out.push_back({text.substr(start, nl - start), true});
    start = nl + 1;
  }
  return out;
}

// Validates header + rows; returns the rows. Line numbers are 1-based.
std::vector<MetricsRow> parse_lines(const std::vector<Line>& lines, const std::string& file) {
  if (lines.empty()) {
    throw FormatError(line_file(file, 1), "",
                      std::string("empty file (expected the header {\"schema\":\"") + kMetricsSchema + "\"})");
  }
  std::vector<MetricsRow> rows;
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string where = line_file(file, static_cast<int64_t>(i) + 1);
    if (lines[i].text.find_first_not_of(" \t\r") == std::string::npos) {
      throw FormatError(where, "", "empty line (every line is one JSON object)");
    }
    const nlohmann::json j = parse_json_text(lines[i].text, where);
    if (i == 0) {
      if (j.is_object() && !j.contains("schema")) {
        throw FormatError(where, "$.schema",
                          std::string("missing header (line 1 must be {\"schema\":\"") + kMetricsSchema + "\"})");
      }
      parse_header(j, where);
      continue;
    }
    if (j.is_object() && j.contains("schema")) {
      throw FormatError(where, "$.schema", "a header is only valid on line 1");
    }
    MetricsRow row = parse_metrics_row(j, where);
    if (!rows.empty() && row.step <= rows.back().step) {
      throw FormatError(where, "$.step",
                        "step " + std::to_string(row.step) + " does not follow step " +
                            std::to_string(rows.back().step) + " of the previous line (steps must increase)");
    }
    rows.push_back(row);
  }
  return rows;
}

std::string metrics_text(const std::vector<MetricsRow>& rows) {
  std::string text = header_json().dump() + "\n";
  for (const auto& row : rows) text += metrics_row_to_line(row) + "\n";
  return text;
}

}  // namespace

bool operator==(const MetricsRow& a, const MetricsRow& b) {
  return a.step == b.step && same_number(a.loss, b.loss) && same_number(a.grad_norm, b.grad_norm) &&
         same_number(a.lr, b.lr) && same_number(a.samples_per_s, b.samples_per_s) &&
         same_number(a.step_ms, b.step_ms) && same_number(a.data_wait_ms, b.data_wait_ms) &&
         same_number(a.peak_gib, b.peak_gib) && a.skipped == b.skipped;
}

nlohmann::json metrics_row_to_json(const MetricsRow& row) {
  // lr, samples_per_s, step_ms and data_wait_ms are written as they are: a NaN there stays a NaN in the JSON
  // value, so the validating parse in append() refuses it instead of hiding it as null.
  return {{"step", row.step},
          {"loss", number_or_null(row.loss)},
          {"grad_norm", number_or_null(row.grad_norm)},
          {"lr", row.lr},
          {"samples_per_s", row.samples_per_s},
          {"step_ms", row.step_ms},
          {"data_wait_ms", row.data_wait_ms},
          {"peak_gib", number_or_null(row.peak_gib)},
          {"skipped", row.skipped}};
}

std::string metrics_row_to_line(const MetricsRow& row) {
  return metrics_row_to_json(row).dump();
}

MetricsRow parse_metrics_row(const nlohmann::json& j, const std::string& file) {
  const JsonCursor root(j, file);
  root.expect_object(
      {"step", "loss", "grad_norm", "lr", "samples_per_s", "step_ms", "data_wait_ms", "peak_gib", "skipped"});
  MetricsRow row;
  row.step = root.at("step").get_int(0);
  row.loss = root.at("loss").get_optional_number().value_or(kNaN);
  row.grad_norm = root.at("grad_norm").get_optional_number(0.0).value_or(kNaN);
  row.lr = root.at("lr").get_number(0.0);
  row.samples_per_s = root.at("samples_per_s").get_number(0.0);
  row.step_ms = root.at("step_ms").get_number(0.0);
  row.data_wait_ms = root.at("data_wait_ms").get_number(0.0);
  row.peak_gib = root.at("peak_gib").get_optional_number(0.0).value_or(kNaN);
  row.skipped = root.at("skipped").get_bool();
  return row;
}

std::vector<MetricsRow> parse_metrics(const std::string& text, const std::string& file) {
  return parse_lines(split_lines(text), file);
}

std::vector<MetricsRow> read_metrics(const std::string& path) {
  return parse_metrics(read_text_file(path, kMaxMetricsFileBytes), path);
}

void write_metrics(const std::vector<MetricsRow>& rows, const std::string& path) {
  // Validate through the reader so a written file always reads back (NaN step_ms, decreasing steps...).
  const std::string text = metrics_text(rows);
  parse_metrics(text, path);
  write_file_atomic(path, text);
}

MetricsWriter::MetricsWriter(std::string path, std::FILE* file, int64_t last_step, int64_t lines)
    : path_(std::move(path)), file_(file), last_step_(last_step), lines_(lines) {}

MetricsWriter::MetricsWriter(MetricsWriter&& other) noexcept
    : path_(std::move(other.path_)), file_(other.file_), last_step_(other.last_step_), lines_(other.lines_) {
  other.file_ = nullptr;
}

MetricsWriter& MetricsWriter::operator=(MetricsWriter&& other) noexcept {
  if (this != &other) {
    if (file_) std::fclose(file_);
    path_ = std::move(other.path_);
    file_ = other.file_;
    last_step_ = other.last_step_;
    lines_ = other.lines_;
    other.file_ = nullptr;
  }
  return *this;
}

MetricsWriter::~MetricsWriter() {
  if (file_) std::fclose(file_);
}

MetricsWriter MetricsWriter::create(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (!f) throw WriteError(path, std::string("cannot create: ") + std::strerror(errno));
  MetricsWriter w(path, f, -1, 0);
  w.write_line(header_json().dump());
  return w;
}

MetricsWriter MetricsWriter::resume(const std::string& path, int64_t last_step) {
  std::vector<Line> lines = split_lines(read_text_file(path, kMaxMetricsFileBytes));
  bool dropped = false;
  if (!lines.empty() && !lines.back().terminated) {
    lines.pop_back();
    dropped = true;
  }
  // A header torn on creation: nothing was recorded, so start the file again.
  std::vector<MetricsRow> rows = lines.empty() && dropped ? std::vector<MetricsRow>{} : parse_lines(lines, path);
  while (!rows.empty() && rows.back().step > last_step) {
    rows.pop_back();
    dropped = true;
  }
  if (dropped) write_file_atomic(path, metrics_text(rows));
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (!f) throw WriteError(path, std::string("cannot open for appending: ") + std::strerror(errno));
  return MetricsWriter(path, f, rows.empty() ? -1 : rows.back().step, static_cast<int64_t>(rows.size()) + 1);
}

void MetricsWriter::append(const MetricsRow& row) {
  const std::string where = line_file(path_, lines_ + 1);
  const nlohmann::json j = metrics_row_to_json(row);
  parse_metrics_row(j, where);
  if (row.step <= last_step_) {
    throw FormatError(where, "$.step",
                      "step " + std::to_string(row.step) + " does not follow step " + std::to_string(last_step_) +
                          " of the previous line (steps must increase)");
  }
  write_line(j.dump());
  last_step_ = row.step;
}

void MetricsWriter::write_line(const std::string& line) {
  if (!file_) throw WriteError(path_, "writer is closed (moved from)");
  const std::string text = line + "\n";
  if (std::fwrite(text.data(), 1, text.size(), file_) != text.size() || std::fflush(file_) != 0) {
    throw WriteError(path_, std::string("write failed: ") + std::strerror(errno));
  }
  ++lines_;
}

}  // namespace vlatune::formats
