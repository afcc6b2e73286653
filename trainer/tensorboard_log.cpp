#include "trainer/tensorboard_log.h"

#include <chrono>
#include <cmath>
#include <utility>

#ifdef VLATUNE_HAVE_TENSORBOARD
#include "formats/tensorboard_events.h"
#endif

namespace vlatune::trainer {

namespace {
double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}
}  // namespace

#ifdef VLATUNE_HAVE_TENSORBOARD
struct TensorBoardLog::Writer {
  Writer(const std::string& dir, double wall_time) : file(dir, wall_time) {}
  formats::EventFileWriter file;
};

TensorBoardLog::TensorBoardLog(const std::string& run_dir, int64_t first_step, bool resuming, std::ostream&) {
  const double now = unix_seconds();
  writer_ = std::make_unique<Writer>(run_dir, now);
  if (resuming) writer_->file.add_session_start(first_step, now);
  writer_->file.flush();
}

void TensorBoardLog::add(const formats::MetricsRow& row) {
  formats::add_metrics_row(&writer_->file, row, unix_seconds());
  writer_->file.flush();
}

void TensorBoardLog::add(int64_t step, const std::vector<std::pair<std::string, double>>& scalars) {
  const double now = unix_seconds();
  for (const auto& [tag, value] : scalars)
    if (std::isfinite(value)) writer_->file.add_scalar(tag, step, value, now);
  writer_->file.flush();
}
#else
struct TensorBoardLog::Writer {};

TensorBoardLog::TensorBoardLog(const std::string&, int64_t, bool, std::ostream& log) {
  log << "TensorBoard event files not written: this build has no event-file writer (protobuf or ISA-L was missing "
         "at configure time; scripts/setup.sh installs them)\n";
}

void TensorBoardLog::add(const formats::MetricsRow&) {}
void TensorBoardLog::add(int64_t, const std::vector<std::pair<std::string, double>>&) {}
#endif

namespace {
class TensorBoardOutput final : public StepOutput {
 public:
  explicit TensorBoardOutput(TensorBoardLog log) : log_(std::move(log)) {}
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
    log_.add(row);
  }

 private:
  TensorBoardLog log_;
};
}  // namespace

std::unique_ptr<StepOutput> make_tensorboard_output(const std::string& run_dir, int64_t first_step, bool resuming,
                                                    std::ostream& log) {
  return std::make_unique<TensorBoardOutput>(TensorBoardLog(run_dir, first_step, resuming, log));
}

TensorBoardLog::~TensorBoardLog() = default;
TensorBoardLog::TensorBoardLog(TensorBoardLog&&) noexcept = default;
TensorBoardLog& TensorBoardLog::operator=(TensorBoardLog&&) noexcept = default;

}  // namespace vlatune::trainer
