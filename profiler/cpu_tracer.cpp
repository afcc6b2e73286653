#include "profiler/cpu_tracer.h"

#include <ATen/record_function.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>

namespace vlatune::profiler {

namespace {

std::atomic<CpuTracer*> g_tracer{nullptr};
thread_local std::vector<uint64_t> t_external;  // pushed scope instances
thread_local int t_depth = 0;                   // ATen op nesting on this thread

uint64_t steady_ns() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

struct OpContext : at::ObserverContext {
  bool top = false;
  uint64_t start = 0;
};

}  // namespace

CpuTracer::~CpuTracer() {
  stop();
}

ApiResult CpuTracer::start() {
  if (started_) return {};
  g_tracer.store(this);
  auto callback = at::RecordFunctionCallback(
                      [](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
                        // The engine's per-node wrapper is not an op: the node's ops run inside it, under the
                        // backward scope the recorder opens for the node, and must count as top-level.
                        if (std::strncmp(fn.name(), "autograd::engine::", 18) == 0) return nullptr;
                        auto ctx = std::make_unique<OpContext>();
                        ctx->top = t_depth++ == 0;
                        if (ctx->top) ctx->start = steady_ns();
                        return ctx;
                      },
                      [](const at::RecordFunction& fn, at::ObserverContext* base) {
                        if (base == nullptr) return;  // the engine's wrapper (see above)
                        --t_depth;
                        auto* ctx = static_cast<OpContext*>(base);
                        CpuTracer* self = g_tracer.load();
                        if (ctx == nullptr || !ctx->top || self == nullptr) return;
                        ActivityRecord r;
                        r.kind = ActivityKind::kKernel;
                        r.name = fn.name();
                        r.start_ns = ctx->start;
                        r.end_ns = steady_ns();
                        r.external_id = t_external.empty() ? 0 : t_external.back();
                        r.thread = os_thread_id();
                        self->record(std::move(r));
                      })
                      .scopes({at::RecordScope::FUNCTION});
  callback_handle_ = at::addGlobalCallback(callback);
  started_ = true;
  return {};
}

void CpuTracer::record(ActivityRecord record) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (keeping_) activities_.push_back(std::move(record));
}

void CpuTracer::begin_window() {
  std::lock_guard<std::mutex> lock(mutex_);
  activities_.clear();
  keeping_ = true;
}

void CpuTracer::end_window() {
  std::lock_guard<std::mutex> lock(mutex_);
  keeping_ = false;
}

void CpuTracer::stop() {
  if (!started_) return;
  at::removeCallback(callback_handle_);
  g_tracer.store(nullptr);
  started_ = false;
}

void CpuTracer::push_external_id(uint64_t id) {
  t_external.push_back(id);
}

void CpuTracer::pop_external_id() {
  if (!t_external.empty()) t_external.pop_back();
}

uint64_t CpuTracer::now_ns() {
  return steady_ns();
}

void CpuTracer::take(TraceData* out) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& a : activities_) out->activities.push_back(std::move(a));
  activities_.clear();
}

}  // namespace vlatune::profiler
