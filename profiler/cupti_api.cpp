#include "profiler/cupti_api.h"

#include <atomic>
#include <cstring>

#ifdef VLATUNE_HAVE_CUPTI
#include <cupti.h>
#endif

namespace vlatune::profiler {

#ifdef VLATUNE_HAVE_CUPTI
namespace {

// CUPTI's buffer callbacks are plain functions; they reach the one client through this pointer (CUPTI allows one
// activity subscriber per process on CUDA <= 13.2, so there is never more than one).
std::atomic<ActivityBufferClient*> g_client{nullptr};

void CUPTIAPI on_buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *max_records = 0;  // as many as fit
  ActivityBufferClient* client = g_client.load();
  *buffer = client != nullptr ? client->request_buffer(size) : nullptr;
  if (*buffer == nullptr) *size = 0;
}

void CUPTIAPI on_buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t size, size_t valid_bytes) {
  ActivityBufferClient* client = g_client.load();
  if (client != nullptr && buffer != nullptr) client->buffer_completed(buffer, size, valid_bytes);
}

void CUPTIAPI on_callback(void*, CUpti_CallbackDomain, CUpti_CallbackId, const void*) {}

std::string error_text(const char* call, CUptiResult rc) {
  const char* message = nullptr;
  cuptiGetResultString(rc, &message);
  return std::string(call) + ": " + (message != nullptr ? message : "unknown CUPTI error");
}

// Activity kinds we enable. CUPTI emits the external correlation of a launch only for API records it is
// recording, so RUNTIME and DRIVER are on for attribution (cuBLAS launches through the driver API); the trace
// also shows them, linked to the work they launched.
constexpr CUpti_ActivityKind kKinds[] = {
    CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,    CUPTI_ACTIVITY_KIND_MEMCPY,  CUPTI_ACTIVITY_KIND_MEMSET,
    CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION, CUPTI_ACTIVITY_KIND_RUNTIME, CUPTI_ACTIVITY_KIND_DRIVER,
};

const char* memcpy_name(uint8_t copy_kind) {
  switch (copy_kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD:
      return "memcpy HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH:
      return "memcpy DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD:
      return "memcpy DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP:
      return "memcpy PtoP";
    default:
      return "memcpy";
  }
}

// The fields every device record (kernel, memcpy, memset) carries under the same names.
template <typename CuptiRecord>
ActivityRecord device_record(ActivityKind kind, const char* name, const CuptiRecord& r) {
  ActivityRecord a;
  a.kind = kind;
  a.name = name;
  a.start_ns = r.start;
  a.end_ns = r.end;
  a.correlation_id = r.correlationId;
  a.stream = r.streamId;
  a.device = r.deviceId;
  a.graph_node = r.graphNodeId;
  return a;
}

class CuptiActivityApi final : public ActivityApi {
 public:
  ~CuptiActivityApi() override {
    if (started_) stop();
  }

  ApiResult start(ActivityBufferClient* client) override {
    CUptiResult rc = cuptiSubscribe(&subscriber_, reinterpret_cast<CUpti_CallbackFunc>(on_callback), nullptr);
    if (rc != CUPTI_SUCCESS) {
      const ApiStatus status =
          rc == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED ? ApiStatus::kBusy
          : rc == CUPTI_ERROR_NOT_INITIALIZED || rc == CUPTI_ERROR_INVALID_DEVICE || rc == CUPTI_ERROR_NOT_COMPATIBLE
              ? ApiStatus::kUnavailable
              : ApiStatus::kError;
      return {status, error_text("cuptiSubscribe", rc)};
    }
    g_client.store(client);
    // API records keyed by gettid, the id the trace's host rows use (records.h os_thread_id()); a failure only
    // leaves them on rows of their own.
    cuptiSetThreadIdType(CUPTI_ACTIVITY_THREAD_ID_TYPE_SYSTEM);
    rc = cuptiActivityRegisterCallbacks(on_buffer_requested, on_buffer_completed);
    if (rc != CUPTI_SUCCESS) return fail("cuptiActivityRegisterCallbacks", rc);
    for (CUpti_ActivityKind kind : kKinds) {
      rc = cuptiActivityEnable(kind);
      if (rc != CUPTI_SUCCESS) return fail("cuptiActivityEnable", rc);
    }
    started_ = true;
    return {};
  }

  void flush() override { cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED); }

  void stop() override {
    for (CUpti_ActivityKind kind : kKinds) cuptiActivityDisable(kind);
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    cuptiUnsubscribe(subscriber_);
    g_client.store(nullptr);
    started_ = false;
  }

  void push_external_id(uint64_t id) override {
    cuptiActivityPushExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, id);
  }
  void pop_external_id() override {
    uint64_t last = 0;
    cuptiActivityPopExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, &last);
  }

  uint64_t timestamp_ns() override {
    uint64_t t = 0;
    cuptiGetTimestamp(&t);
    return t;
  }

  uint64_t dropped_records() override {
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped) != CUPTI_SUCCESS) return 0;
    return dropped;
  }

  void decode(const uint8_t* buffer, size_t valid_bytes, std::vector<ActivityRecord>* activities,
              std::vector<CorrelationRecord>* correlations) override {
    CUpti_Activity* record = nullptr;
    auto* bytes = const_cast<uint8_t*>(buffer);
    while (cuptiActivityGetNextRecord(bytes, valid_bytes, &record) == CUPTI_SUCCESS) {
      switch (record->kind) {
        case CUPTI_ACTIVITY_KIND_KERNEL:
        case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
          const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
          activities->push_back(
              device_record(ActivityKind::kKernel, k->name != nullptr ? k->name : "<unnamed kernel>", *k));
          ActivityRecord& a = activities->back();
          a.grid = {static_cast<uint32_t>(k->gridX), static_cast<uint32_t>(k->gridY), static_cast<uint32_t>(k->gridZ)};
          a.block = {static_cast<uint32_t>(k->blockX), static_cast<uint32_t>(k->blockY),
                     static_cast<uint32_t>(k->blockZ)};
          a.registers_per_thread = k->registersPerThread;
          a.shared_memory_bytes =
              static_cast<uint32_t>(k->staticSharedMemory) + static_cast<uint32_t>(k->dynamicSharedMemory);
          break;
        }
        case CUPTI_ACTIVITY_KIND_MEMCPY: {
          const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
          activities->push_back(device_record(ActivityKind::kMemcpy, memcpy_name(m->copyKind), *m));
          activities->back().bytes = m->bytes;
          break;
        }
        case CUPTI_ACTIVITY_KIND_MEMSET: {
          const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
          activities->push_back(device_record(ActivityKind::kMemset, "memset", *m));
          activities->back().bytes = m->bytes;
          break;
        }
        case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: {
          const auto* c = reinterpret_cast<const CUpti_ActivityExternalCorrelation*>(record);
          if (c->externalKind == CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0)
            correlations->push_back({c->correlationId, c->externalId});
          break;
        }
        case CUPTI_ACTIVITY_KIND_RUNTIME:
        case CUPTI_ACTIVITY_KIND_DRIVER: {
          const auto* c = reinterpret_cast<const CUpti_ActivityAPI*>(record);
          const bool runtime = record->kind == CUPTI_ACTIVITY_KIND_RUNTIME;
          ActivityRecord a;
          a.kind = runtime ? ActivityKind::kRuntime : ActivityKind::kDriver;
          const char* name = nullptr;
          if (cuptiGetCallbackName(runtime ? CUPTI_CB_DOMAIN_RUNTIME_API : CUPTI_CB_DOMAIN_DRIVER_API, c->cbid,
                                   &name) != CUPTI_SUCCESS ||
              name == nullptr)
            name = runtime ? "cuda runtime call" : "cuda driver call";
          a.name = name;
          a.start_ns = c->start;
          a.end_ns = c->end;
          a.correlation_id = c->correlationId;
          a.thread = c->threadId;
          a.cbid = c->cbid;
          activities->push_back(std::move(a));
          break;
        }
        default:
          break;
      }
    }
  }

 private:
  ApiResult fail(const char* call, CUptiResult rc) {
    for (CUpti_ActivityKind kind : kKinds) cuptiActivityDisable(kind);
    cuptiUnsubscribe(subscriber_);
    g_client.store(nullptr);
    return {ApiStatus::kError, error_text(call, rc)};
  }

  CUpti_SubscriberHandle subscriber_ = nullptr;
  bool started_ = false;
};

}  // namespace

std::unique_ptr<ActivityApi> make_cupti_activity_api() {
  return std::make_unique<CuptiActivityApi>();
}

std::vector<uint8_t> encode_activity_buffer_for_test(const std::vector<ActivityRecord>& activities,
                                                     const std::vector<CorrelationRecord>& correlations) {
  std::vector<uint8_t> buffer;
  auto append = [&buffer](const void* record, size_t size) {
    const size_t at = buffer.size();
    buffer.resize(at + size);
    std::memcpy(buffer.data() + at, record, size);
  };
  for (const ActivityRecord& a : activities) {
    if (a.kind == ActivityKind::kKernel) {
      CUpti_ActivityKernel10 k{};
      k.kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
      k.name = a.name.c_str();
      k.start = a.start_ns;
      k.end = a.end_ns;
      k.correlationId = a.correlation_id;
      k.streamId = a.stream;
      k.deviceId = a.device;
      k.graphNodeId = a.graph_node;
      k.gridX = static_cast<int32_t>(a.grid[0]);
      k.gridY = static_cast<int32_t>(a.grid[1]);
      k.gridZ = static_cast<int32_t>(a.grid[2]);
      k.blockX = static_cast<int32_t>(a.block[0]);
      k.blockY = static_cast<int32_t>(a.block[1]);
      k.blockZ = static_cast<int32_t>(a.block[2]);
      k.registersPerThread = static_cast<uint16_t>(a.registers_per_thread);
      k.dynamicSharedMemory = static_cast<int32_t>(a.shared_memory_bytes);
      append(&k, sizeof k);
    } else if (a.kind == ActivityKind::kRuntime || a.kind == ActivityKind::kDriver) {
      CUpti_ActivityAPI c{};
      c.kind = a.kind == ActivityKind::kRuntime ? CUPTI_ACTIVITY_KIND_RUNTIME : CUPTI_ACTIVITY_KIND_DRIVER;
      c.cbid = a.cbid;
      c.start = a.start_ns;
      c.end = a.end_ns;
      c.threadId = static_cast<uint32_t>(a.thread);
      c.correlationId = a.correlation_id;
      append(&c, sizeof c);
    } else if (a.kind == ActivityKind::kMemcpy) {
      CUpti_ActivityMemcpy6 m{};
      m.kind = CUPTI_ACTIVITY_KIND_MEMCPY;
      m.copyKind = CUPTI_ACTIVITY_MEMCPY_KIND_HTOD;
      m.start = a.start_ns;
      m.end = a.end_ns;
      m.correlationId = a.correlation_id;
      m.bytes = a.bytes;
      append(&m, sizeof m);
    } else {
      CUpti_ActivityMemset4 m{};
      m.kind = CUPTI_ACTIVITY_KIND_MEMSET;
      m.start = a.start_ns;
      m.end = a.end_ns;
      m.correlationId = a.correlation_id;
      m.bytes = a.bytes;
      append(&m, sizeof m);
    }
  }
  for (const CorrelationRecord& c : correlations) {
    CUpti_ActivityExternalCorrelation e{};
    e.kind = CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION;
    e.externalKind = CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0;
    e.externalId = c.external_id;
    e.correlationId = c.correlation_id;
    append(&e, sizeof e);
  }
  return buffer;
}

std::string cupti_version_text() {
  uint32_t version = 0;
  const CUptiResult rc = cuptiGetVersion(&version);
  if (rc != CUPTI_SUCCESS) return "CUPTI unavailable: " + error_text("cuptiGetVersion", rc);
  return "CUPTI API " + std::to_string(version);
}

#else  // built without CUDA

namespace {
class UnavailableActivityApi final : public ActivityApi {
 public:
  ApiResult start(ActivityBufferClient*) override {
    return {ApiStatus::kUnavailable, "CUPTI not built (configured without CUDA)"};
  }
  void flush() override {}
  void stop() override {}
  void push_external_id(uint64_t) override {}
  void pop_external_id() override {}
  uint64_t timestamp_ns() override { return 0; }
  uint64_t dropped_records() override { return 0; }
  void decode(const uint8_t*, size_t, std::vector<ActivityRecord>*, std::vector<CorrelationRecord>*) override {}
};
}  // namespace

std::unique_ptr<ActivityApi> make_cupti_activity_api() {
  return std::make_unique<UnavailableActivityApi>();
}

std::vector<uint8_t> encode_activity_buffer_for_test(const std::vector<ActivityRecord>&,
                                                     const std::vector<CorrelationRecord>&) {
  return {};
}

std::string cupti_version_text() {
  return "CUPTI not built (configured without CUDA)";
}

#endif

}  // namespace vlatune::profiler
