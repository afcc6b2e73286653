// metrics.jsonl: one line per training step and one per held-out evaluation, written as the run goes (so a
// crashed run keeps its metrics).
//
// Layout: JSON Lines (one compact JSON object per line, '\n'-terminated, UTF-8).
//   line 1, the header:  {"schema":"vlatune.metrics/2"}   ("vlatune.metrics/1": training rows only, still read)
//   line 2.., rows of two kinds, interleaved in the order they happened; within each kind steps strictly increase.
//   Training rows (no "kind" key), every key present:
//     {"step":12,"loss":0.173,"grad_norm":1.02,"lr":2.5e-05,"samples_per_s":41.7,"step_ms":767.3,
//      "data_wait_ms":0.4,"peak_gib":71.3,"skipped":false}
//   Evaluation rows ("kind":"eval", written after the training row of the same step), every key present:
//     {"kind":"eval","step":12,"loss":0.21,"action_mae":0.013,"action_rmse":0.021,
//      "action_mae_per_dim":[...],"action_rmse_per_dim":[...],"samples":64,"batches":8,"sample_steps":10,
//      "eval_ms":812.3}
// Training row fields:
//   step           0-based optimizer step (int64 >= 0)
//   loss           training loss of the step; null when non-finite (the step was skipped)
//   grad_norm      global gradient norm before clipping (>= 0); null when non-finite
//   lr             learning rate used by the step (>= 0)
//   samples_per_s  samples of this step / step_ms (>= 0)
//   step_ms        wall time of the step, data wait included (ms, >= 0)
//   data_wait_ms   time the step waited for its batch (ms, >= 0)
//   peak_gib       peak device memory allocated so far (GiB = 2^30 bytes, >= 0); null when not measured (CPU)
//   skipped        true when the update was skipped (non-finite loss or gradient norm)
// Evaluation row fields (trainer/evaluate.h computes them; the weights are those after training step `step`):
//   step                  the optimizer step the weights come from (int64 >= 0)
//   loss                  flow-matching loss on the held-out batches, noise and time from a fixed seed; null when
//                         non-finite
//   action_mae            mean |sampled - true| over samples, horizon and the real action dims, in the dataset's
//                         real units (un-normalized with its norm stats); null when non-finite
//   action_rmse           the root of the mean squared difference, same units; null when non-finite
//   action_mae_per_dim    the same per real action dim (an array of >= 1 entries, each >= 0 or null);
//   action_rmse_per_dim   both arrays of one length
//   samples, batches      held-out samples and batches evaluated (int64 >= 1)
//   sample_steps          Euler steps of each sampled chunk (int64 >= 1)
//   eval_ms               wall time of the evaluation (ms, >= 0)
// In the row structs, a null reads as NaN (and a NaN/Inf is written as null).
// Errors name the line: "metrics.jsonl:7: $.step_ms: expected a finite number >= 0, got string \"fast\"" (so
// FormatError::file() is "PATH:LINE"). A header is only valid on line 1; unknown keys are rejected (new fields mean
// a new schema version).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace vlatune::formats {

inline constexpr const char* kMetricsSchema = "vlatune.metrics/2";
inline constexpr const char* kMetricsSchemaV1 = "vlatune.metrics/1";  // training rows only; read, not written
// About five million rows: the largest metrics file the readers accept.
inline constexpr uint64_t kMaxMetricsFileBytes = 1ull << 30;

struct MetricsRow {
  int64_t step = 0;
  double loss = 0;
  double grad_norm = 0;
  double lr = 0;
  double samples_per_s = 0;
  double step_ms = 0;
  double data_wait_ms = 0;
  double peak_gib = 0;
  bool skipped = false;
};

struct EvalRow {
  int64_t step = 0;
  double loss = 0;
  double action_mae = 0;
  double action_rmse = 0;
  std::vector<double> action_mae_per_dim, action_rmse_per_dim;
  int64_t samples = 1;
  int64_t batches = 1;
  int64_t sample_steps = 10;
  double eval_ms = 0;
};

// Every row of a file, by kind, each in file order.
struct MetricsLog {
  std::vector<MetricsRow> train;
  std::vector<EvalRow> eval;
};

// NaNs compare equal to each other (a null read back equals the NaN written).
bool operator==(const MetricsRow& a, const MetricsRow& b);
bool operator==(const EvalRow& a, const EvalRow& b);

// One row as its JSON object / its line without the '\n'.
nlohmann::json metrics_row_to_json(const MetricsRow& row);
std::string metrics_row_to_line(const MetricsRow& row);
// Validates one row object; `file` is "PATH:LINE".
MetricsRow parse_metrics_row(const nlohmann::json& j, const std::string& file);
nlohmann::json eval_row_to_json(const EvalRow& row);
EvalRow parse_eval_row(const nlohmann::json& j, const std::string& file);

// Parses a whole file's text (header + rows); `file` names it in errors. A final line without '\n' is accepted
// when it is valid (MetricsWriter::resume drops a torn one).
MetricsLog parse_metrics_log(const std::string& text, const std::string& file);
// Reads and validates every line of a metrics file.
MetricsLog read_metrics_log(const std::string& path);
// The training rows only (every line is still validated).
std::vector<MetricsRow> parse_metrics(const std::string& text, const std::string& file);
std::vector<MetricsRow> read_metrics(const std::string& path);
// Writes header + rows atomically (fixtures, tests, rewriting a file): the training rows, each evaluation row
// after the training row of its step (before the first training row of a later step).
void write_metrics(const std::vector<MetricsRow>& rows, const std::string& path);
void write_metrics_log(const MetricsLog& log, const std::string& path);

// Appends rows as training runs: one line per append(), flushed at once (not fsynced: a crash loses at most the
// line being written, which resume() then drops). Move-only; the destructor closes the file.
class MetricsWriter {
 public:
  // Creates (or truncates) `path` and writes the header. Write failures (disk full, ...) are formats::WriteError.
  static MetricsWriter create(const std::string& path);
  // Continues the file of a run resumed from the checkpoint taken after step `last_step`: validates the existing
  // lines, drops a torn last line (no '\n': the process died while writing it) and the rows of either kind after
  // `last_step` (written after that checkpoint, and about to be redone), rewriting the file atomically when
  // anything was dropped or the file is a vlatune.metrics/1 one (its header becomes /2); then appends. Missing or
  // invalid file -> FormatError.
  static MetricsWriter resume(const std::string& path, int64_t last_step);

  // Validates the row (same rules as the reader, and step after the previous row's) and writes its line.
  void append(const MetricsRow& row);
  // Validates an evaluation row (its step after the previous evaluation row's) and writes its line.
  void append(const EvalRow& row);

  const std::string& path() const { return path_; }
  // Step of the last row in the file; -1 when there is none.
  int64_t last_step() const { return last_step_; }
  // Step of the last evaluation row; -1 when there is none.
  int64_t last_eval_step() const { return last_eval_step_; }

  MetricsWriter(MetricsWriter&& other) noexcept;
  MetricsWriter& operator=(MetricsWriter&& other) noexcept;
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  ~MetricsWriter();

 private:
  MetricsWriter(std::string path, std::FILE* file, int64_t last_step, int64_t last_eval_step, int64_t lines);
  void write_line(const std::string& line);

  std::string path_;
  std::FILE* file_ = nullptr;
  int64_t last_step_ = -1;
  int64_t last_eval_step_ = -1;
  int64_t lines_ = 0;  // lines in the file, header included
};

}  // namespace vlatune::formats
