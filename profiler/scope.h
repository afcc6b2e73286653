// Module scopes: every model module's forward (and, with the profiler, its backward) opens one, named by
// the module's openpi FQN, so profiles attribute GPU work to modules without the model being rewritten.
//
// Dependency-free on purpose: model/, trainer/ and kernels/ include it without pulling in CUPTI or torch.
// Profiling off is the common case and costs one relaxed atomic load and one branch per scope. The
// profiler installs a ScopeSink (NVTX range + CUPTI external correlation id); nothing else changes.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace vlatune::profiler {

// Which pass of the step a scope belongs to. A recomputed forward (activation checkpointing) is its own
// phase so that its time is never mistaken for the first forward.
enum class Phase : int { kForward = 0, kBackward = 1, kRecompute = 2, kOptimizer = 3, kOther = 4 };

inline const char* phase_name(Phase phase) {
  switch (phase) {
    case Phase::kForward:
      return "forward";
    case Phase::kBackward:
      return "backward";
    case Phase::kRecompute:
      return "recompute";
    case Phase::kOptimizer:
      return "optimizer";
    case Phase::kOther:
      return "other";
  }
  return "other";
}

// Receives scope begin/end events. Implementations must be thread-safe: backward scopes are pushed on the
// autograd engine's threads. `fqn` stays valid until the matching pop().
class ScopeSink {
 public:
  virtual ~ScopeSink() = default;
  virtual void push(const std::string& fqn, Phase phase) = 0;
  virtual void pop() = 0;
  // A GEMM y[m, n] = x[m, k] W^T run by the Linears `members` (one, or several for a merged GEMM).
  virtual void gemm(const std::vector<const std::string*>& members, int64_t m, int64_t k, int64_t n) {}
};

// Work outside model modules is attributed to these pseudo-modules (profile.json uses the same names).
inline constexpr const char* kOptimizerScope = "<optimizer>";
inline constexpr const char* kLossScope = "<loss>";
inline constexpr const char* kDataScope = "<data>";
inline constexpr const char* kCommScope = "<comm>";
inline constexpr const char* kInputsScope = "<inputs>";  // masks, positions, RoPE tables, time embedding

namespace detail {
inline std::atomic<ScopeSink*>& active_sink() {
  static std::atomic<ScopeSink*> sink{nullptr};
  return sink;
}
// The phase a forward scope records in: kForward normally, kRecompute while a checkpointed module re-runs.
inline thread_local Phase forward_phase = Phase::kForward;
}  // namespace detail

// Installs `sink` (nullptr switches scopes off). The caller keeps the sink alive until it uninstalls it.
inline void set_scope_sink(ScopeSink* sink) {
  detail::active_sink().store(sink, std::memory_order_release);
}
inline bool scopes_enabled() {
  return detail::active_sink().load(std::memory_order_relaxed) != nullptr;
}

// Reports a GEMM's shape to the profiler (nothing when profiling is off). Linears call it from their forward;
// a merged GEMM passes all its member FQNs, in the order of their output columns.
inline void note_gemm(const std::vector<const std::string*>& members, int64_t m, int64_t k, int64_t n) {
  ScopeSink* sink = detail::active_sink().load(std::memory_order_acquire);
  if (sink != nullptr) sink->gemm(members, m, k, n);
}

// RAII scope. `fqn` must outlive the scope (modules pass their own stored name).
class Scope {
 public:
  explicit Scope(const std::string& fqn) : Scope(fqn, detail::forward_phase) {}
  Scope(const std::string& fqn, Phase phase) {
    ScopeSink* sink = detail::active_sink().load(std::memory_order_acquire);
    if (sink != nullptr) {
      sink->push(fqn, phase);
      sink_ = sink;
    }
  }
  ~Scope() {
    if (sink_ != nullptr) sink_->pop();
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  ScopeSink* sink_ = nullptr;
};

// Marks the forward scopes opened on this thread, while alive, as a recompute (used by the recompute wrapper).
class RecomputePhaseGuard {
 public:
  RecomputePhaseGuard() : saved_(detail::forward_phase) { detail::forward_phase = Phase::kRecompute; }
  ~RecomputePhaseGuard() { detail::forward_phase = saved_; }
  RecomputePhaseGuard(const RecomputePhaseGuard&) = delete;
  RecomputePhaseGuard& operator=(const RecomputePhaseGuard&) = delete;

 private:
  Phase saved_;
};

}  // namespace vlatune::profiler
