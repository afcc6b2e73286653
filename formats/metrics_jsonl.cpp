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

// Returns true for the current schema, false for vlatune.metrics/1 (training rows only).
bool parse_header(const nlohmann::json& j, const std::string& file) {
  const JsonCursor root(j, file);
  root.expect_object({"schema"});
  const JsonCursor schema = root.at("schema");
  const std::string value = schema.get_string();
  if (value == kMetricsSchema) return true;
  if (value == kMetricsSchemaV1) return false;
  schema.fail(std::string("expected \"") + kMetricsSchema + "\" (or \"" + kMetricsSchemaV1 + "\"), got " +
              describe_json(schema.value()));
}

bool is_eval_row(const nlohmann::json& j) {
  return j.is_object() && j.contains("kind");
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

// Validates header + rows. Line numbers are 1-based. `v2` (optional) receives whether the header is the current one.
MetricsLog parse_lines(const std::vector<Line>& lines, const std::string& file, bool* v2 = nullptr) {
  if (lines.empty()) {
    throw FormatError(line_file(file, 1), "",
                      std::string("empty file (expected the header {\"schema\":\"") + kMetricsSchema + "\"})");
  }
  MetricsLog log;
  bool current = true;
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
      current = parse_header(j, where);
      continue;
    }
    if (j.is_object() && j.contains("schema")) {
      throw FormatError(where, "$.schema", "a header is only valid on line 1");
    }
    if (is_eval_row(j)) {
      if (!current)
        throw FormatError(where, "$.kind",
                          std::string("evaluation rows need the header \"") + kMetricsSchema + "\" (this file is \"" +
                              kMetricsSchemaV1 + "\")");
      EvalRow row = parse_eval_row(j, where);
      if (!log.eval.empty() && row.step <= log.eval.back().step) {
        throw FormatError(where, "$.step",
                          "evaluation step " + std::to_string(row.step) + " does not follow evaluation step " +
                              std::to_string(log.eval.back().step) + " (steps must increase)");
      }
      log.eval.push_back(std::move(row));
      continue;
    }
    MetricsRow row = parse_metrics_row(j, where);
    if (!log.train.empty() && row.step <= log.train.back().step) {
      throw FormatError(where, "$.step",
                        "step " + std::to_string(row.step) + " does not follow step " +
                            std::to_string(log.train.back().step) + " of the previous line (steps must increase)");
    }
    log.train.push_back(row);
  }
  if (v2 != nullptr) *v2 = current;
  return log;
}

// Header, then the training rows, each evaluation row after the training row of its step.
std::string metrics_text(const MetricsLog& log) {
  std::string text = header_json().dump() + "\n";
  size_t e = 0;
  for (const auto& row : log.train) {
    while (e < log.eval.size() && log.eval[e].step < row.step) text += eval_row_to_json(log.eval[e++]).dump() + "\n";
    text += metrics_row_to_line(row) + "\n";
    while (e < log.eval.size() && log.eval[e].step == row.step) text += eval_row_to_json(log.eval[e++]).dump() + "\n";
  }
  while (e < log.eval.size()) text += eval_row_to_json(log.eval[e++]).dump() + "\n";
  return text;
}

bool same_numbers(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!same_number(a[i], b[i])) return false;
  return true;
}

nlohmann::json numbers_or_null(const std::vector<double>& v) {
  nlohmann::json a = nlohmann::json::array();
  for (double x : v) a.push_back(number_or_null(x));
  return a;
}

std::vector<double> read_per_dim(const JsonCursor& c) {
  const size_t n = c.expect_array();
  if (n == 0) c.fail("expected at least one entry (one per real action dim)");
  std::vector<double> out;
  for (size_t i = 0; i < n; ++i) out.push_back(c.element(i).get_optional_number(0.0).value_or(kNaN));
  return out;
}

}  // namespace

bool operator==(const EvalRow& a, const EvalRow& b) {
  return a.step == b.step && same_number(a.loss, b.loss) && same_number(a.action_mae, b.action_mae) &&
         same_number(a.action_rmse, b.action_rmse) && same_numbers(a.action_mae_per_dim, b.action_mae_per_dim) &&
         same_numbers(a.action_rmse_per_dim, b.action_rmse_per_dim) && a.samples == b.samples &&
         a.batches == b.batches && a.sample_steps == b.sample_steps && same_number(a.eval_ms, b.eval_ms);
}

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

nlohmann::json eval_row_to_json(const EvalRow& row) {
  // eval_ms and the counts are written as they are (a NaN stays a NaN, which the validating parse refuses).
  return {{"kind", "eval"},
          {"step", row.step},
          {"loss", number_or_null(row.loss)},
          {"action_mae", number_or_null(row.action_mae)},
          {"action_rmse", number_or_null(row.action_rmse)},
          {"action_mae_per_dim", numbers_or_null(row.action_mae_per_dim)},
          {"action_rmse_per_dim", numbers_or_null(row.action_rmse_per_dim)},
          {"samples", row.samples},
          {"batches", row.batches},
          {"sample_steps", row.sample_steps},
          {"eval_ms", row.eval_ms}};
}

EvalRow parse_eval_row(const nlohmann::json& j, const std::string& file) {
  const JsonCursor root(j, file);
  root.expect_object({"kind", "step", "loss", "action_mae", "action_rmse", "action_mae_per_dim", "action_rmse_per_dim",
                      "samples", "batches", "sample_steps", "eval_ms"});
  const JsonCursor kind = root.at("kind");
  if (kind.get_string() != "eval")
    kind.fail("expected \"eval\" (training rows carry no \"kind\"), got " + describe_json(kind.value()));
  EvalRow row;
  row.step = root.at("step").get_int(0);
  row.loss = root.at("loss").get_optional_number().value_or(kNaN);
  row.action_mae = root.at("action_mae").get_optional_number(0.0).value_or(kNaN);
  row.action_rmse = root.at("action_rmse").get_optional_number(0.0).value_or(kNaN);
  row.action_mae_per_dim = read_per_dim(root.at("action_mae_per_dim"));
  const JsonCursor rmse = root.at("action_rmse_per_dim");
  row.action_rmse_per_dim = read_per_dim(rmse);
  if (row.action_rmse_per_dim.size() != row.action_mae_per_dim.size())
    rmse.fail("expected " + std::to_string(row.action_mae_per_dim.size()) + " entries (as action_mae_per_dim), got " +
              std::to_string(row.action_rmse_per_dim.size()));
  row.samples = root.at("samples").get_int(1);
  row.batches = root.at("batches").get_int(1);
  row.sample_steps = root.at("sample_steps").get_int(1);
  row.eval_ms = root.at("eval_ms").get_number(0.0);
  return row;
}

MetricsLog parse_metrics_log(const std::string& text, const std::string& file) {
  return parse_lines(split_lines(text), file);
}

MetricsLog read_metrics_log(const std::string& path) {
  return parse_metrics_log(read_text_file(path, kMaxMetricsFileBytes), path);
}

std::vector<MetricsRow> parse_metrics(const std::string& text, const std::string& file) {
  return parse_metrics_log(text, file).train;
}

std::vector<MetricsRow> read_metrics(const std::string& path) {
  return read_metrics_log(path).train;
}

void write_metrics_log(const MetricsLog& log, const std::string& path) {
  // Validate through the reader so a written file always reads back (NaN step_ms, decreasing steps...).
  const std::string text = metrics_text(log);
  parse_metrics_log(text, path);
  write_file_atomic(path, text);
}

void write_metrics(const std::vector<MetricsRow>& rows, const std::string& path) {
  write_metrics_log(MetricsLog{rows, {}}, path);
}

MetricsWriter::MetricsWriter(std::string path, std::FILE* file, int64_t last_step, int64_t last_eval_step,
                             int64_t lines)
    : path_(std::move(path)), file_(file), last_step_(last_step), last_eval_step_(last_eval_step), lines_(lines) {}

MetricsWriter::MetricsWriter(MetricsWriter&& other) noexcept
    : path_(std::move(other.path_)),
      file_(other.file_),
      last_step_(other.last_step_),
      last_eval_step_(other.last_eval_step_),
      lines_(other.lines_) {
  other.file_ = nullptr;
}

MetricsWriter& MetricsWriter::operator=(MetricsWriter&& other) noexcept {
  if (this != &other) {
    if (file_) std::fclose(file_);
    path_ = std::move(other.path_);
    file_ = other.file_;
    last_step_ = other.last_step_;
    last_eval_step_ = other.last_eval_step_;
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
  MetricsWriter w(path, f, -1, -1, 0);
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
  bool current = true;
  MetricsLog log = lines.empty() && dropped ? MetricsLog{} : parse_lines(lines, path, &current);
  while (!log.train.empty() && log.train.back().step > last_step) {
    log.train.pop_back();
    dropped = true;
  }
  while (!log.eval.empty() && log.eval.back().step > last_step) {
    log.eval.pop_back();
    dropped = true;
  }
  if (dropped || !current) write_file_atomic(path, metrics_text(log));
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (!f) throw WriteError(path, std::string("cannot open for appending: ") + std::strerror(errno));
  return MetricsWriter(path, f, log.train.empty() ? -1 : log.train.back().step,
                       log.eval.empty() ? -1 : log.eval.back().step,
                       static_cast<int64_t>(log.train.size() + log.eval.size()) + 1);
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

void MetricsWriter::append(const EvalRow& row) {
  const std::string where = line_file(path_, lines_ + 1);
  const nlohmann::json j = eval_row_to_json(row);
  parse_eval_row(j, where);
  if (row.step <= last_eval_step_) {
    throw FormatError(where, "$.step",
                      "evaluation step " + std::to_string(row.step) + " does not follow evaluation step " +
                          std::to_string(last_eval_step_) + " (steps must increase)");
  }
  write_line(j.dump());
  last_eval_step_ = row.step;
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
