// The profiler's torch-free pieces: CUPTI record decoding on synthetic buffers, the CUPTI tracer's degraded paths with
// a fake CUPTI, attribution (inclusive/self times, backward ancestry, unattributed kernels). The trace export:
// tests/torch/test_profiler_trace_export.cpp.
#include <catch2/catch.hpp>

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "formats/profile.h"
#include "profiler/attribution.h"
#include "profiler/cupti_api.h"
#include "profiler/trace_export.h"
#include "profiler/tracer.h"

using namespace vlatune::profiler;

namespace {

// A CUPTI stand-in: start() answers `status`; request/complete cycles are driven by the test.
class FakeApi final : public ActivityApi {
 public:
  explicit FakeApi(ApiStatus status) : status_(status) {}
  ApiResult start(ActivityBufferClient* client) override {
    client_ = client;
    return {status_, status_ == ApiStatus::kOk ? "" : "cuptiSubscribe: CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED"};
  }
  void flush() override {
    // Complete every outstanding buffer with one kernel record each.
    for (uint8_t* b : outstanding) client_->buffer_completed(b, CuptiTracer::kBufferBytes, 1);
    outstanding.clear();
  }
  void stop() override {}
  void push_external_id(uint64_t) override {}
  void pop_external_id() override {}
  uint64_t timestamp_ns() override { return 0; }
  uint64_t dropped_records() override { return dropped; }
  void decode(const uint8_t*, size_t, std::vector<ActivityRecord>* activities,
              std::vector<CorrelationRecord>* correlations) override {
    ActivityRecord a;
    a.name = "kernel";
    a.start_ns = 0;
    a.end_ns = 1000;
    a.correlation_id = 1;
    activities->push_back(a);
    correlations->push_back({1, 7});
  }
  ActivityBufferClient* client_ = nullptr;
  std::vector<uint8_t*> outstanding;
  uint64_t dropped = 0;
  ApiStatus status_;
};

ScopeRecord scope(uint64_t id, uint64_t parent, int32_t fqn, Phase phase, uint64_t forward_of = 0) {
  ScopeRecord s;
  s.id = id;
  s.parent = parent;
  s.fqn = fqn;
  s.phase = phase;
  s.forward_of = forward_of;
  return s;
}

ActivityRecord kernel(const std::string& name, uint64_t ms, uint32_t correlation) {
  ActivityRecord a;
  a.name = name;
  a.start_ns = 0;
  a.end_ns = ms * 1000000;
  a.correlation_id = correlation;
  return a;
}

}  // namespace

TEST_CASE("CUPTI records decode from a buffer laid out as CUPTI fills it", "[profiler]") {
  std::vector<ActivityRecord> in = {kernel("gemm_kernel", 2, 11), kernel("elementwise", 1, 12), kernel("", 1, 11),
                                    kernel("", 1, 13)};
  in[0].grid = {132, 2, 1};
  in[0].block = {384, 1, 1};
  in[0].registers_per_thread = 168;
  in[0].shared_memory_bytes = 65536;
  in[1].kind = ActivityKind::kMemset;
  in[1].bytes = 4096;
  // The runtime call that launched the GEMM and a driver call (cuBLAS launches through the driver API).
  in[2].kind = ActivityKind::kRuntime;
  in[2].cbid = 211;  // cudaLaunchKernel_v7000
  in[2].thread = 4321;
  in[3].kind = ActivityKind::kDriver;
  in[3].cbid = 307;  // cuLaunchKernel
  const std::vector<uint8_t> buffer = encode_activity_buffer_for_test(in, {{11, 5}, {12, 6}});
  if (buffer.empty()) {
    WARN("built without CUPTI: nothing to decode");
    return;
  }
  auto api = make_cupti_activity_api();
  std::vector<ActivityRecord> activities;
  std::vector<CorrelationRecord> correlations;
  api->decode(buffer.data(), buffer.size(), &activities, &correlations);
  REQUIRE(activities.size() == 4);
  CHECK(activities[0].name == "gemm_kernel");
  CHECK(activities[0].end_ns == 2000000);
  CHECK(activities[0].correlation_id == 11);
  CHECK(activities[0].grid == std::array<uint32_t, 3>{132, 2, 1});
  CHECK(activities[0].block == std::array<uint32_t, 3>{384, 1, 1});
  CHECK(activities[0].registers_per_thread == 168);
  CHECK(activities[0].shared_memory_bytes == 65536);
  CHECK(activities[1].kind == ActivityKind::kMemset);
  CHECK(activities[1].bytes == 4096);
  CHECK(activities[2].kind == ActivityKind::kRuntime);
  CHECK(activities[2].name == "cudaLaunchKernel_v7000");
  CHECK(activities[2].correlation_id == 11);
  CHECK(activities[2].thread == 4321);
  CHECK(activities[2].cbid == 211);
  CHECK(activities[3].kind == ActivityKind::kDriver);
  CHECK(activities[3].name == "cuLaunchKernel");
  REQUIRE(correlations.size() == 2);
  CHECK(correlations[1].correlation_id == 12);
  CHECK(correlations[1].external_id == 6);
}

TEST_CASE("A busy CUPTI (another client subscribed) is reported, not fatal", "[profiler]") {
  CuptiTracer tracer(std::make_unique<FakeApi>(ApiStatus::kBusy));
  const ApiResult r = tracer.start();
  CHECK(r.status == ApiStatus::kBusy);
  CHECK_THAT(r.message, Catch::Contains("MULTIPLE_SUBSCRIBERS"));
}

TEST_CASE("The tracer's buffer pool is bounded and keeps only the window's records", "[profiler]") {
  auto owned = std::make_unique<FakeApi>(ApiStatus::kOk);
  FakeApi* api = owned.get();
  CuptiTracer tracer(std::move(owned), /*max_buffers=*/2);
  REQUIRE(tracer.start().ok());
  auto* client = api->client_;
  size_t size = 0;
  // Before the window: a completed buffer's records are dropped.
  api->outstanding.push_back(client->request_buffer(&size));
  CHECK(size == CuptiTracer::kBufferBytes);
  tracer.begin_window();
  for (int i = 0; i < 2; ++i) api->outstanding.push_back(client->request_buffer(&size));
  CHECK(tracer.buffers_outstanding() == 2);
  CHECK(client->request_buffer(&size) == nullptr);  // the pool is exhausted: CUPTI drops records
  CHECK(size == 0);
  api->dropped = 5;
  tracer.end_window();
  CHECK(tracer.buffers_outstanding() == 0);
  TraceData t;
  tracer.take(&t);
  CHECK(t.activities.size() == 2);
  CHECK(t.correlations.size() == 2);
  CHECK(t.dropped_records == 5);
}

TEST_CASE("Attribution: inclusive and self times, backward through the forward's ancestry", "[profiler]") {
  TraceData t;
  t.names = {"layer", "layer.mlp", "<optimizer>"};
  t.scopes = {scope(1, 0, 0, Phase::kForward), scope(2, 1, 1, Phase::kForward),
              // backward instance of layer.mlp, opened on an engine thread: its ancestry is the forward's
              scope(3, 1, 1, Phase::kBackward, 2), scope(4, 0, 2, Phase::kOptimizer),
              scope(5, 3, 1, Phase::kRecompute)};
  t.activities = {kernel("sm90_gemm", 4, 1),       kernel("gemm_mlp", 2, 2),   kernel("bwd", 6, 3),
                  kernel("adamw", 1, 4),           kernel("recomputed", 3, 5), kernel("lost", 2, 99),
                  kernel("cudaLaunchKernel", 7, 1)};
  t.activities.back().kind = ActivityKind::kRuntime;  // a host call: no device time, attributed to nothing
  t.correlations = {{1, 2}, {2, 2}, {3, 3}, {4, 4}, {5, 5}};
  // Kernel 1's correlation points at the mlp, so: layer.mlp forward 6 ms.
  t.correlations[0] = {1, 1};
  const AttributionResult a = attribute(t, /*steps=*/2, {{"layer", {"GemmaDecoderLayer", 100}}});
  auto row = [&](const std::string& fqn) {
    for (const auto& m : a.modules)
      if (m.fqn == fqn) return m;
    FAIL("no row " << fqn);
    return vlatune::formats::ModuleCost{};
  };
  CHECK(row("layer").kind == "GemmaDecoderLayer");
  CHECK(row("layer").parameter_bytes == 100);
  CHECK(row("layer").forward_ms == Approx((4 + 2) / 2.0));
  CHECK(row("layer.mlp").forward_ms == Approx(2 / 2.0));
  CHECK(row("layer.mlp").backward_ms == Approx(6 / 2.0));
  CHECK(row("layer").backward_ms == Approx(6 / 2.0));
  CHECK(row("layer.mlp").recompute_ms == Approx(3 / 2.0));
  CHECK(row("layer").self_ms == Approx(4 / 2.0));
  CHECK(row("<optimizer>").kind == "pseudo");
  CHECK(row("<optimizer>").forward_ms == Approx(0.5));
  CHECK(a.attribution.gpu_ms == Approx(18 / 2.0));
  CHECK(a.attribution.attributed_fraction == Approx(16.0 / 18.0));
  REQUIRE(a.attribution.unattributed.size() == 1);
  CHECK(a.attribution.unattributed[0].name == "lost");
  CHECK(a.kernels.front().name == "bwd");
  CHECK(kernel_category("nvjet_tst_192x192_64x4", ActivityKind::kKernel) == "gemm");
  CHECK(kernel_category("cudnn_generated_fort_native_sdpa_sm90_flash_fprop", ActivityKind::kKernel) == "attention");
}
