// The only place that talks to CUPTI. Everything else in the profiler sees ActivityApi, so a fake can stand in
// for CUPTI on the CPU (tests of the degraded paths: CUPTI busy because nsys/ncu/another profiler subscribed,
// buffers exhausted) and decode() is tested on synthetic buffers laid out as CUPTI fills them. Torch-free.
//
// How kernels get module names (anchors.md §2.1): the scope recorder pushes our scope instance id as a CUPTI
// external correlation id (kind CUSTOM0) on the thread that launches the work; CUPTI then emits an
// EXTERNAL_CORRELATION record (its correlationId -> our id) for each runtime call made inside, and every kernel
// carries the correlationId of its launch. Attribution joins the two.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "profiler/records.h"

namespace vlatune::profiler {

// CUPTI calls these from its own threads (asynchronous buffer mode).
class ActivityBufferClient {
 public:
  virtual ~ActivityBufferClient() = default;
  // A buffer for CUPTI to fill (8-byte aligned), or nullptr when the pool is exhausted: CUPTI then drops
  // records and counts them (rejecting a buffer is safe from CUPTI API v27 on; CUDA 13 has v>=130000).
  virtual uint8_t* request_buffer(size_t* size) = 0;
  // A filled buffer (valid_bytes of records): decode it and take the buffer back.
  virtual void buffer_completed(uint8_t* buffer, size_t size, size_t valid_bytes) = 0;
};

enum class ApiStatus {
  kOk,
  kBusy,         // another CUPTI client (nsys, ncu, compute-sanitizer, a second profiler) holds the subscription
  kUnavailable,  // built without CUPTI, or no CUDA device/driver
  kError,        // any other CUPTI failure
};

struct ApiResult {
  ApiStatus status = ApiStatus::kOk;
  std::string message;  // the CUPTI call and its error string when not kOk
  bool ok() const { return status == ApiStatus::kOk; }
};

class ActivityApi {
 public:
  virtual ~ActivityApi() = default;
  // Subscribes, registers the buffer callbacks and enables CONCURRENT_KERNEL, EXTERNAL_CORRELATION, MEMCPY,
  // MEMSET, RUNTIME, DRIVER. On failure nothing stays enabled or subscribed.
  virtual ApiResult start(ActivityBufferClient* client) = 0;
  // Forced flush: every buffer, complete or not, has reached buffer_completed when this returns. Never call it
  // while holding a lock that buffer_completed takes (CUPTI calls back on this thread).
  virtual void flush() = 0;
  // Disables the activity kinds and unsubscribes (call flush() first).
  virtual void stop() = 0;
  // Our external correlation ids, per calling thread (a stack).
  virtual void push_external_id(uint64_t id) = 0;
  virtual void pop_external_id() = 0;
  // The clock of the activity records (ns).
  virtual uint64_t timestamp_ns() = 0;
  // Records CUPTI dropped since start() (buffers refused or full).
  virtual uint64_t dropped_records() = 0;
  // Appends the records of one completed buffer (kernels, memcpys, memsets, runtime and driver API calls, external
  // correlations).
  virtual void decode(const uint8_t* buffer, size_t valid_bytes, std::vector<ActivityRecord>* activities,
                      std::vector<CorrelationRecord>* correlations) = 0;
};

// The real CUPTI (when built with CUDA; otherwise an api whose start() reports kUnavailable).
std::unique_ptr<ActivityApi> make_cupti_activity_api();

// Tests: a buffer laid out as CUPTI fills it (CUDA 13 record structs, back to back), holding `activities`
// followed by `correlations`. Names must outlive the buffer's decoding. Empty when built without CUPTI.
std::vector<uint8_t> encode_activity_buffer_for_test(const std::vector<ActivityRecord>& activities,
                                                     const std::vector<CorrelationRecord>& correlations);

// "CUPTI API <n>" from cuptiGetVersion, or why it is unavailable ("not built with CUDA", a CUPTI error).
std::string cupti_version_text();

}  // namespace vlatune::profiler
