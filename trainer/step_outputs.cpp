#include "trainer/step_outputs.h"

#include <cmath>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <utility>

namespace vlatune::trainer {

namespace {

// "42s", "3m07s", "2h05m"; "?" when not finite or negative.
std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<int64_t>(seconds + 0.5);
  std::ostringstream os;
  if (s >= 3600)
    os << s / 3600 << "h" << std::setw(2) << std::setfill('0') << (s % 3600) / 60 << "m";
  else if (s >= 60)
    os << s / 60 << "m" << std::setw(2) << std::setfill('0') << s % 60 << "s";
  else
    os << s << "s";
  return os.str();
}

class MetricsOutput : public StepOutput {
 public:
  explicit MetricsOutput(formats::MetricsWriter writer) : writer_(std::move(writer)) {}
  void write_step(const StepRecord& r) override {
    formats::MetricsRow row;
    row.step = r.step;
    row.loss = r.loss;
    row.grad_norm = r.grad_norm;
    row.lr = r.lr;
    row.samples_per_s = r.samples_per_s;
    row.step_ms = r.step_ms;
    row.data_wait_ms = r.data_wait_ms;
    row.peak_gib = r.peak_gib;
    row.skipped = r.skipped;
    writer_.append(row);
  }
  void write_eval(const formats::EvalRow& row) override { writer_.append(row); }

 private:
  formats::MetricsWriter writer_;
};

class LogOutput : public StepOutput {
 public:
  LogOutput(std::ostream& log, bool bar, int64_t log_every, bool show_peak)
      : log_(log), bar_(bar), log_every_(log_every), show_peak_(show_peak) {}
  void write_step(const StepRecord& r) override {
    if (bar_) {
      const int width = 30;
      const int filled = static_cast<int>(width * (r.step + 1) / r.total_steps);
      std::ostringstream os;
      os << "\r[" << std::string(filled, '#') << std::string(width - filled, '.') << "] " << r.step + 1 << "/"
         << r.total_steps << " loss " << std::setprecision(4) << r.loss << " " << std::fixed << std::setprecision(1)
         << r.samples_per_s << " samples/s ETA " << format_duration(r.eta_s) << "   ";
      std::cerr << os.str() << std::flush;
    } else if (log_every_ > 0 && (r.step % log_every_ == 0 || r.step + 1 == r.total_steps)) {
      log_ << "step " << r.step + 1 << "/" << r.total_steps << " | loss " << std::setprecision(6) << r.loss
           << " | gnorm " << std::setprecision(4) << r.grad_norm << " | lr " << std::scientific << std::setprecision(2)
           << r.lr << std::defaultfloat << " | " << std::fixed << std::setprecision(1) << r.step_ms << " ms | "
           << r.samples_per_s << " samples/s | wait " << r.data_wait_ms << " ms";
      if (show_peak_) log_ << " | peak " << std::setprecision(2) << r.peak_gib << " GiB";
      log_ << " | ETA " << format_duration(r.eta_s) << std::defaultfloat << "\n";
    }
  }
  void finish() override {
    if (bar_) std::cerr << "\n";
  }

 private:
  std::ostream& log_;
  bool bar_;
  int64_t log_every_;
  bool show_peak_;
};

}  // namespace

std::unique_ptr<StepOutput> make_metrics_output(formats::MetricsWriter writer) {
  return std::make_unique<MetricsOutput>(std::move(writer));
}

std::unique_ptr<StepOutput> make_log_output(std::ostream& log, bool bar, int64_t log_every, bool show_peak) {
  return std::make_unique<LogOutput>(log, bar, log_every, show_peak);
}

}  // namespace vlatune::trainer
