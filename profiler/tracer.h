// Tracer: records device activity (CUPTI: kernels, memcpys, memsets) or, on the CPU, host time of ATen ops, and
// tags each with the external id (scope instance) pushed on the launching thread. The scope recorder drives
// push/pop; the session opens and closes the window. Implementations: CuptiTracer, CpuTracer.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "profiler/cupti_api.h"
#include "profiler/records.h"

namespace vlatune::profiler {

class Tracer {
 public:
  virtual ~Tracer() = default;
  virtual const char* kind() const = 0;  // "cupti" | "cpu" (profile.json settings.tracer)
  // Starts recording. Not ok: nothing is recorded (the caller degrades to step timing only and says why).
  virtual ApiResult start() = 0;
  // Drops everything recorded so far (warm-up); records from now on are kept.
  virtual void begin_window() = 0;
  // Makes everything launched so far available to take() (CUPTI: a forced flush). Call after the device is
  // synchronized.
  virtual void end_window() = 0;
  virtual void stop() = 0;
  virtual void push_external_id(uint64_t id) = 0;
  virtual void pop_external_id() = 0;
  virtual uint64_t now_ns() = 0;  // the clock of the records
  // Moves the window's activities and correlations into `out` and adds the dropped-record count.
  virtual void take(TraceData* out) = 0;
};

// Device tracer over the CUPTI activity API (or a fake in tests). Buffers: 4 MiB each (CUPTI recommends 1-10 MB),
// at most `max_buffers` outstanding; beyond that CUPTI is refused a buffer and its records are dropped (counted,
// reported).
class CuptiTracer final : public Tracer, private ActivityBufferClient {
 public:
  static constexpr size_t kBufferBytes = size_t{4} << 20;
  explicit CuptiTracer(std::unique_ptr<ActivityApi> api, size_t max_buffers = 64);
  ~CuptiTracer() override;

  const char* kind() const override { return "cupti"; }
  ApiResult start() override;
  void begin_window() override;
  void end_window() override;
  void stop() override;
  void push_external_id(uint64_t id) override { api_->push_external_id(id); }
  void pop_external_id() override { api_->pop_external_id(); }
  uint64_t now_ns() override { return api_->timestamp_ns(); }
  void take(TraceData* out) override;

  size_t buffers_outstanding() const;

 private:
  uint8_t* request_buffer(size_t* size) override;
  void buffer_completed(uint8_t* buffer, size_t size, size_t valid_bytes) override;

  std::unique_ptr<ActivityApi> api_;
  const size_t max_buffers_;
  bool started_ = false;
  mutable std::mutex mutex_;  // guards everything below; never held across an api_ call that may call back
  std::vector<uint8_t*> free_buffers_;
  size_t outstanding_ = 0;
  uint64_t refused_buffers_ = 0;
  uint64_t dropped_at_window_start_ = 0;
  bool keeping_ = false;  // inside a window: decoded records are kept
  std::vector<ActivityRecord> activities_;
  std::vector<CorrelationRecord> correlations_;
};

}  // namespace vlatune::profiler
