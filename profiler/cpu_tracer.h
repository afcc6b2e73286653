// CpuTracer: the Tracer for CPU runs (CI, the tiny model). Each top-level ATen op is one activity record with
// its host time, tagged with the scope instance open on its thread; nested ops count inside their caller.
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

#include "profiler/tracer.h"

namespace vlatune::profiler {

class CpuTracer final : public Tracer {
 public:
  CpuTracer() = default;
  ~CpuTracer() override;
  const char* kind() const override { return "cpu"; }
  ApiResult start() override;
  void begin_window() override;
  void end_window() override;
  void stop() override;
  void push_external_id(uint64_t id) override;
  void pop_external_id() override;
  uint64_t now_ns() override;
  void take(TraceData* out) override;

  // The RecordFunction callback's work (public for the callback, which is a plain function).
  void record(ActivityRecord record);

 private:
  uint64_t callback_handle_ = 0;
  bool started_ = false;
  std::mutex mutex_;
  bool keeping_ = false;
  std::vector<ActivityRecord> activities_;
};

}  // namespace vlatune::profiler
