// One training step as the run's outputs see it. The train loop makes one StepRecord per optimizer step and hands
// it to every StepOutput of the run, in order: the metrics.jsonl row and the log line (or progress bar) are two
// views of the same record, so they never disagree. A new per-step output (another file format, an evaluation
// row) is one more StepOutput here, registered where the run opens its outputs (train_loop.cpp, open_outputs).
#pragma once

#include <cstdint>
#include <memory>
#include <ostream>

#include "formats/metrics_jsonl.h"

namespace vlatune::trainer {

struct StepRecord {
  int64_t step = 0;          // 0-based optimizer step
  int64_t total_steps = 0;   // the run's steps
  double loss = 0;           // mean over the micro-batches (and the ranks); NaN/Inf when non-finite
  double grad_norm = 0;      // global gradient norm before clipping
  double lr = 0;             // learning rate the step used
  double step_ms = 0;        // wall time of the step, data wait included
  double data_wait_ms = 0;   // time the step waited for its batches
  double samples_per_s = 0;  // the global batch / step_ms
  double peak_gib = 0;       // peak device memory of the step (0 on the CPU)
  bool skipped = false;      // non-finite loss or gradient norm: the update was skipped
  double eta_s = 0;          // estimated time to the end of the run, from this segment's mean step time
};

class StepOutput {
 public:
  virtual ~StepOutput() = default;
  virtual void write_step(const StepRecord& record) = 0;
  // A held-out evaluation after the step just written (trainer/evaluate.h TrainEvaluation); metrics.jsonl keeps it.
  virtual void write_eval(const formats::EvalRow& row) { (void)row; }
  // After the last step (also on SIGINT/SIGTERM), before the run's summary lines.
  virtual void finish() {}
};

// metrics.jsonl: one row per step (formats/metrics_jsonl.h), flushed as it goes.
std::unique_ptr<StepOutput> make_metrics_output(formats::MetricsWriter writer);

// A progress bar with rate and ETA on stderr (`bar`), else one plain line on `log` every `log_every` steps (and at the
// last); `show_peak`: the device's peak memory in the line (GPU runs).
std::unique_ptr<StepOutput> make_log_output(std::ostream& log, bool bar, int64_t log_every, bool show_peak);

}  // namespace vlatune::trainer
