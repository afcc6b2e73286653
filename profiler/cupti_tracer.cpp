#include <cstdlib>
#include <utility>

#include "profiler/tracer.h"

namespace vlatune::profiler {

CuptiTracer::CuptiTracer(std::unique_ptr<ActivityApi> api, size_t max_buffers)
    : api_(std::move(api)), max_buffers_(max_buffers) {}

CuptiTracer::~CuptiTracer() {
  if (started_) stop();
  for (uint8_t* b : free_buffers_) std::free(b);
}

ApiResult CuptiTracer::start() {
  ApiResult r = api_->start(this);
  started_ = r.ok();
  return r;
}

void CuptiTracer::begin_window() {
  api_->flush();  // not under mutex_: CUPTI calls buffer_completed on this thread
  const uint64_t dropped = api_->dropped_records();
  std::lock_guard<std::mutex> lock(mutex_);
  activities_.clear();
  correlations_.clear();
  dropped_at_window_start_ = dropped;
  keeping_ = true;
}

void CuptiTracer::end_window() {
  api_->flush();
  std::lock_guard<std::mutex> lock(mutex_);
  keeping_ = false;
}

void CuptiTracer::stop() {
  if (!started_) return;
  api_->stop();
  started_ = false;
}

void CuptiTracer::take(TraceData* out) {
  const uint64_t dropped = api_->dropped_records();
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& a : activities_) out->activities.push_back(std::move(a));
  for (const auto& c : correlations_) out->correlations.push_back(c);
  activities_.clear();
  correlations_.clear();
  out->dropped_records += dropped - std::min(dropped, dropped_at_window_start_);
}

size_t CuptiTracer::buffers_outstanding() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return outstanding_;
}

uint8_t* CuptiTracer::request_buffer(size_t* size) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (outstanding_ >= max_buffers_) {
    ++refused_buffers_;
    *size = 0;
    return nullptr;
  }
  uint8_t* buffer = nullptr;
  if (!free_buffers_.empty()) {
    buffer = free_buffers_.back();
    free_buffers_.pop_back();
  } else {
    buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
    if (buffer == nullptr) {
      *size = 0;
      return nullptr;
    }
  }
  ++outstanding_;
  *size = kBufferBytes;
  return buffer;
}

void CuptiTracer::buffer_completed(uint8_t* buffer, size_t, size_t valid_bytes) {
  // Decode outside the lock (it only reads the buffer), append under it.
  std::vector<ActivityRecord> activities;
  std::vector<CorrelationRecord> correlations;
  api_->decode(buffer, valid_bytes, &activities, &correlations);
  std::lock_guard<std::mutex> lock(mutex_);
  if (keeping_) {
    for (auto& a : activities) activities_.push_back(std::move(a));
    correlations_.insert(correlations_.end(), correlations.begin(), correlations.end());
  }
  free_buffers_.push_back(buffer);
  if (outstanding_ > 0) --outstanding_;
}

}  // namespace vlatune::profiler
