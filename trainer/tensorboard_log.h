// The run's TensorBoard event file (formats/tensorboard_events.h), written beside metrics.jsonl with the same rows:
// `tensorboard --logdir RUN_DIR` (or the parent of several run directories) plots loss, gradient norm, learning
// rate, throughput and step time as training goes. Torch-free. In a build without the event-file writer
// (VLATUNE_HAVE_TENSORBOARD unset: protobuf or ISA-L missing) it writes nothing and says so once.
#pragma once

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "formats/metrics_jsonl.h"
#include "trainer/step_outputs.h"

namespace vlatune::trainer {

class TensorBoardLog {
 public:
  // Starts a new event file in `run_dir`. A resumed run marks its restart at `first_step`, so TensorBoard drops
  // what the earlier files hold from that step on (they are redone). Failures are formats::WriteError.
  TensorBoardLog(const std::string& run_dir, int64_t first_step, bool resuming, std::ostream& log);
  ~TensorBoardLog();
  TensorBoardLog(TensorBoardLog&&) noexcept;
  TensorBoardLog& operator=(TensorBoardLog&&) noexcept;

  // The row's scalars at its step, stamped now, flushed to the file.
  void add(const formats::MetricsRow& row);
  // Other scalars of a step (evaluation rows: {"eval/loss", ...}), stamped now, flushed; non-finite values are left
  // out as metrics.jsonl's nulls are.
  void add(int64_t step, const std::vector<std::pair<std::string, double>>& scalars);

 private:
  struct Writer;
  std::unique_ptr<Writer> writer_;
};

// The run's StepOutput (trainer/step_outputs.h) that writes each step record to a new event file in `run_dir`.
std::unique_ptr<StepOutput> make_tensorboard_output(const std::string& run_dir, int64_t first_step, bool resuming,
                                                    std::ostream& log);

}  // namespace vlatune::trainer
