// ScopeRecorder: the profiler's ScopeSink. For every scope it records an instance (FQN, phase, step, parent,
// host times on the tracer's clock, caching-allocator bytes at open and close), pushes the instance id as the
// tracer's external correlation id and, on CUDA, an NVTX range (so nsys shows the same names).
//
// Backward attribution without touching the model: autograd numbers every node with the sequence number of
// the forward op that created it, on the forward thread. The recorder notes the sequence number at each scope
// boundary, so any sequence number maps to the forward scope that was open when it was allocated. A
// RecordFunction callback on BACKWARD_FUNCTION then opens, on the engine thread that runs the node, a backward
// instance of that forward scope for the node's duration: its kernels carry the module's name, phase backward.
// A recomputed forward (RecomputePhaseGuard) records its scopes with phase recompute; the backward of the
// recomputed graph maps to them and counts as backward.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "profiler/records.h"
#include "profiler/scope.h"
#include "profiler/tracer.h"

namespace vlatune::profiler {

class ScopeRecorder final : public ScopeSink {
 public:
  // tracer: may be null (scopes only). allocated_bytes: the caching allocator's current bytes (null: no memory
  // probes). nvtx: also emit NVTX ranges.
  ScopeRecorder(Tracer* tracer, std::function<int64_t()> allocated_bytes, bool nvtx);
  ~ScopeRecorder() override;
  ScopeRecorder(const ScopeRecorder&) = delete;
  ScopeRecorder& operator=(const ScopeRecorder&) = delete;

  // Becomes the active scope sink and registers the backward callback; uninstall() undoes both.
  void install();
  void uninstall();

  void set_step(int64_t step) { step_ = step; }

  // Called (on the thread that opens the next phase's first scope) when the step moves from one phase to the
  // next: forward -> backward (a recompute counts as backward) -> optimizer. The session reads and resets the
  // allocator's peak there. reset_phase() marks the start of a step (phase forward).
  void set_phase_listener(std::function<void(Phase ended)> listener) { phase_listener_ = std::move(listener); }
  void reset_phase() { current_phase_.store(Phase::kForward); }

  void push(const std::string& fqn, Phase phase) override;
  void pop() override;
  void gemm(const std::vector<const std::string*>& members, int64_t m, int64_t k, int64_t n) override;

  // Opens/closes a backward instance of forward instance `forward_id` on this thread (the callback's work;
  // public for tests).
  void push_backward(uint64_t forward_id);
  // The forward (or recompute) instance open on forward thread `thread` when sequence number `seq` was
  // allocated; 0 when none.
  uint64_t forward_instance_for(uint64_t thread, uint64_t seq) const;

  // Moves scopes, names and GEMM shapes recorded so far into `out` (clears them; instance ids keep counting).
  void take(TraceData* out);

 private:
  uint64_t open(int32_t fqn, Phase phase, uint64_t forward_of, const char* nvtx_name);
  int32_t intern(const std::string& fqn);  // requires mutex_

  Tracer* tracer_;
  std::function<int64_t()> allocated_bytes_;
  bool nvtx_;
  bool installed_ = false;
  uint64_t callback_handle_ = 0;
  int64_t step_ = 0;
  std::function<void(Phase)> phase_listener_;
  std::atomic<Phase> current_phase_{Phase::kForward};

  mutable std::mutex mutex_;
  uint64_t next_id_ = 1;
  std::vector<ScopeRecord> scopes_;             // since the last take()
  std::unordered_map<uint64_t, size_t> index_;  // open instance id -> position in scopes_
  std::vector<std::string> names_;
  std::unordered_map<std::string, int32_t> name_index_;
  std::vector<GemmShapeRecord> gemms_;
  // Per forward thread (RecordFunction thread id): (sequence number, instance open from it on), in order.
  std::map<uint64_t, std::vector<std::pair<uint64_t, uint64_t>>> boundaries_;
  // Every instance ever opened: id -> (fqn, parent); backward instances resolve their forward through it.
  std::unordered_map<uint64_t, std::pair<int32_t, uint64_t>> instances_;
  std::unordered_set<std::string> gemm_keys_;  // members of the GEMMs recorded since take(), joined
};

}  // namespace vlatune::profiler
