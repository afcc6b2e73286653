#include "profiler/scope_recorder.h"

#include <ATen/SequenceNumber.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>

#ifdef VLATUNE_HAVE_CUPTI
#include <nvtx3/nvToolsExt.h>
#endif

namespace vlatune::profiler {

namespace {

// The installed recorder, for the RecordFunction callback (a plain function).
std::atomic<ScopeRecorder*> g_recorder{nullptr};

struct OpenScope {
  uint64_t id;
  Phase phase;
};
thread_local std::vector<OpenScope> t_open;
// After a backward node returns, the engine still launches work for it on the same thread: it reduces the
// node's gradients to their inputs' shapes (validate_outputs) and adds them into the next nodes' input buffers.
// That work belongs to the node that produced the gradients, so its instance stays pushed as the thread's
// external id ("trailing") until the next scope opens there.
thread_local uint64_t t_trailing = 0;
thread_local const void* t_trailing_owner = nullptr;

uint32_t thread_number() {
  static std::atomic<uint32_t> next{1};
  thread_local uint32_t number = next.fetch_add(1);
  return number;
}

uint64_t host_ns() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

struct BackwardPushed : at::ObserverContext {};

bool is_forward(Phase phase) {
  return phase == Phase::kForward || phase == Phase::kRecompute;
}

}  // namespace

ScopeRecorder::ScopeRecorder(Tracer* tracer, std::function<int64_t()> allocated_bytes, bool nvtx)
    : tracer_(tracer), allocated_bytes_(std::move(allocated_bytes)), nvtx_(nvtx) {}

ScopeRecorder::~ScopeRecorder() {
  uninstall();
}

void ScopeRecorder::install() {
  if (installed_) return;
  g_recorder.store(this);
  auto callback = at::RecordFunctionCallback(
                      [](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
                        ScopeRecorder* self = g_recorder.load();
                        if (self == nullptr || fn.seqNr() < 0) return nullptr;
                        const uint64_t forward =
                            self->forward_instance_for(fn.forwardThreadId(), static_cast<uint64_t>(fn.seqNr()));
                        if (forward == 0) return nullptr;
                        self->push_backward(forward);
                        return std::make_unique<BackwardPushed>();
                      },
                      [](const at::RecordFunction&, at::ObserverContext* ctx) {
                        ScopeRecorder* self = g_recorder.load();
                        if (ctx != nullptr && self != nullptr) self->pop();
                      })
                      .scopes({at::RecordScope::BACKWARD_FUNCTION});
  callback_handle_ = at::addGlobalCallback(callback);
  set_scope_sink(this);
  installed_ = true;
}

void ScopeRecorder::uninstall() {
  if (!installed_) return;
  set_scope_sink(nullptr);
  at::removeCallback(callback_handle_);
  g_recorder.store(nullptr);
  installed_ = false;
}

int32_t ScopeRecorder::intern(const std::string& fqn) {
  auto it = name_index_.find(fqn);
  if (it != name_index_.end()) return it->second;
  const auto index = static_cast<int32_t>(names_.size());
  names_.push_back(fqn);
  name_index_.emplace(fqn, index);
  return index;
}

uint64_t ScopeRecorder::open(int32_t fqn, Phase phase, uint64_t forward_of, const char* nvtx_name) {
  if (phase_listener_) {
    const Phase step_phase = phase == Phase::kRecompute ? Phase::kBackward : phase;
    if (step_phase == Phase::kForward || step_phase == Phase::kBackward || step_phase == Phase::kOptimizer) {
      const Phase previous = current_phase_.exchange(step_phase);
      if (previous != step_phase) phase_listener_(previous);
    }
  }
  ScopeRecord r;
  r.phase = phase;
  r.step = step_;
  r.thread = thread_number();
  r.os_thread = os_thread_id();
  r.forward_of = forward_of;
  r.begin_ns = tracer_ != nullptr ? tracer_->now_ns() : host_ns();
  if (allocated_bytes_ && is_forward(phase)) r.allocated_begin = allocated_bytes_();
  if (t_trailing != 0) {
    if (tracer_ != nullptr && t_trailing_owner == this) tracer_->pop_external_id();
    t_trailing = 0;
  }
  const uint64_t parent_on_thread = t_open.empty() ? 0 : t_open.back().id;
  const uint64_t seq = at::sequence_number::peek();
  const uint64_t rf_thread = at::RecordFunction::currentThreadId();
  uint64_t id = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    id = next_id_++;
    r.id = id;
    if (forward_of != 0) {
      // A backward instance takes its forward's name and ancestry.
      const auto& fwd = instances_.at(forward_of);
      r.fqn = fwd.first;
      r.parent = fwd.second;
    } else {
      r.fqn = fqn;
      r.parent = parent_on_thread;
    }
    instances_[id] = {r.fqn, r.parent};
    index_[id] = scopes_.size();
    scopes_.push_back(r);
    if (is_forward(phase)) boundaries_[rf_thread].emplace_back(seq, id);
  }
  if (tracer_ != nullptr) tracer_->push_external_id(id);
#ifdef VLATUNE_HAVE_CUPTI
  if (nvtx_) nvtxRangePushA(nvtx_name);
#else
  (void)nvtx_name;
#endif
  t_open.push_back({id, phase});
  return id;
}

void ScopeRecorder::push(const std::string& fqn, Phase phase) {
  int32_t index = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    index = intern(fqn);
  }
  open(index, phase, 0, fqn.c_str());
}

void ScopeRecorder::push_backward(uint64_t forward_id) {
  std::string name;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    name = names_.at(static_cast<size_t>(instances_.at(forward_id).first));
  }
  open(-1, Phase::kBackward, forward_id, name.c_str());
}

void ScopeRecorder::pop() {
  if (t_open.empty()) return;  // unbalanced pop (a scope opened before install): ignore
  const OpenScope closing = t_open.back();
  t_open.pop_back();
#ifdef VLATUNE_HAVE_CUPTI
  if (nvtx_) nvtxRangePop();
#endif
  if (tracer_ != nullptr) tracer_->pop_external_id();
  if (closing.phase == Phase::kBackward && t_open.empty() && tracer_ != nullptr) {
    tracer_->push_external_id(closing.id);
    t_trailing = closing.id;
    t_trailing_owner = this;
  }
  const uint64_t end = tracer_ != nullptr ? tracer_->now_ns() : host_ns();
  const int64_t allocated = allocated_bytes_ && is_forward(closing.phase) ? allocated_bytes_() : -1;
  const uint64_t seq = at::sequence_number::peek();
  const uint64_t rf_thread = at::RecordFunction::currentThreadId();
  const uint64_t now_open = t_open.empty() ? 0 : t_open.back().id;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = index_.find(closing.id);
  if (it != index_.end()) {
    scopes_[it->second].end_ns = end;
    scopes_[it->second].allocated_end = allocated;
    index_.erase(it);
  }
  if (is_forward(closing.phase)) boundaries_[rf_thread].emplace_back(seq, now_open);
}

uint64_t ScopeRecorder::forward_instance_for(uint64_t thread, uint64_t seq) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = boundaries_.find(thread);
  if (it == boundaries_.end()) return 0;
  const auto& b = it->second;
  // The last boundary at or before `seq`: boundaries recorded with peek() == seq came before the op that took it.
  auto after = std::upper_bound(b.begin(), b.end(), seq,
                                [](uint64_t s, const std::pair<uint64_t, uint64_t>& e) { return s < e.first; });
  if (after == b.begin()) return 0;
  return std::prev(after)->second;
}

void ScopeRecorder::gemm(const std::vector<const std::string*>& members, int64_t m, int64_t k, int64_t n) {
  GemmShapeRecord g;
  std::string key;
  for (const std::string* fqn : members) {
    g.members.push_back(*fqn);
    key += *fqn + "|";
  }
  g.m = m;
  g.k = k;
  g.n = n;
  g.phase = t_open.empty() ? Phase::kForward : t_open.back().phase;
  std::lock_guard<std::mutex> lock(mutex_);
  if (!gemm_keys_.insert(key).second) return;
  gemms_.push_back(std::move(g));
}

void ScopeRecorder::take(TraceData* out) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& s : scopes_) out->scopes.push_back(s);
  out->names = names_;
  for (auto& g : gemms_) out->gemms.push_back(std::move(g));
  scopes_.clear();
  index_.clear();
  gemms_.clear();
  gemm_keys_.clear();
}

}  // namespace vlatune::profiler
