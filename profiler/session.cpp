#include "profiler/session.h"

#include <c10/core/Device.h>
#include <c10/util/Exception.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iomanip>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include "formats/json_io.h"
#include "formats/numbers.h"
#include "layout/pi05.h"
#include "profiler/attribution.h"
#include "profiler/cpu_tracer.h"
#include "profiler/gemm_timing.h"
#include "profiler/scope_recorder.h"
#include "profiler/trace_export.h"

#ifdef VLATUNE_HAVE_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>
#endif
#include <unistd.h>

namespace vlatune::profiler {

namespace {

using formats::median;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// Device memory through the caching allocator (CUDA only).
struct Memory {
  bool cuda = false;
  c10::DeviceIndex device = 0;  // the model's GPU (cuda:LOCAL_RANK under `vlatune launch`)
  int64_t allocated() const {
#ifdef VLATUNE_HAVE_CUDA
    if (cuda) {
      const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device);
      return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].current;
    }
#endif
    return 0;
  }
  double peak_gib() const {
#ifdef VLATUNE_HAVE_CUDA
    if (cuda) {
      const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device);
      return static_cast<double>(
                 stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak) /
             kGiB;
    }
#endif
    return 0.0;
  }
  void reset_peak() const {
#ifdef VLATUNE_HAVE_CUDA
    if (cuda) c10::cuda::CUDACachingAllocator::resetPeakStats(device);
#endif
  }
  void release_cache() const {
#ifdef VLATUNE_HAVE_CUDA
    if (cuda) c10::cuda::CUDACachingAllocator::emptyCache();
#endif
  }
};

// Is module `fqn` recomputed under `selection`?
bool covered(const std::string& fqn, const std::vector<std::string>& selection) {
  return std::any_of(selection.begin(), selection.end(),
                     [&](const std::string& unit) { return layout::unit_covers(unit, fqn); });
}

std::string module_kind(const torch::nn::Module& m) {
  std::string name = m.name();
  const auto colon = name.rfind("::");
  if (colon != std::string::npos) name = name.substr(colon + 2);
  if (name.size() > 4 && name.compare(name.size() - 4, 4, "Impl") == 0) name.resize(name.size() - 4);
  return name;
}

std::map<std::string, ModuleInfo> module_infos(const model::Pi05Impl& model) {
  std::map<std::string, ModuleInfo> out;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    ModuleInfo info;
    info.kind = module_kind(*item.value());
    for (const auto& p : item.value()->parameters()) info.parameter_bytes += static_cast<int64_t>(p.nbytes());
    out.emplace(item.key(), info);
  }
  return out;
}

struct Timed {
  std::vector<double> ms;
  std::vector<double> data_wait_ms;  // what run_step reported, one per entry of ms
  double peak_gib = 0;
  std::vector<double> read_each_ms;  // with read_each: the same number of run_step calls (the overhead baseline)
};

class Session {
 public:
  Session(model::Pi05Impl& model, const StepDriver& driver, const ProfileOptions& options, std::ostream& log)
      : model_(model), driver_(driver), opt_(options), log_(log) {
    memory_.cuda = model.parameters().front().is_cuda();
    if (memory_.cuda) memory_.device = model.parameters().front().device().index();
    baseline_ = model.recompute_selection();
  }

  formats::Profile run();

 private:
  // `warmup` untimed steps, then `n` timed ones (StepDriver::run_timed_steps where set); `read_each`: then `n` more
  // run_step calls timed by the host clock (Timed::read_each_ms).
  Timed time_steps(int64_t warmup, int64_t n, bool read_each = false);
  formats::BatchProfile profile_batch(int64_t batch, bool first, TraceData* trace_out, double* traced_ms);
  std::unique_ptr<Tracer> make_tracer();
  std::map<std::string, int64_t> probe_output_bytes();
  void recompute_ab(formats::BatchProfile& b, const Timed& base);
  std::vector<formats::GemmEntry> gemm_inventory(const std::vector<GemmShapeRecord>& shapes);
  void measure_communication(const TraceData& trace);
  TraceMetadata trace_metadata() const;  // for trace.json.gz: this process, its GPU, the world

  model::Pi05Impl& model_;
  const StepDriver& driver_;
  const ProfileOptions& opt_;
  std::ostream& log_;
  Memory memory_;
  std::vector<std::string> baseline_;
  int64_t next_step_ = 0;
  std::string tracer_kind_ = "none";
  std::vector<std::string> degraded_;
  std::optional<formats::Communication> communication_;
  double read_each_ms_ = 0.0;  // the requested batch's untraced steps read one by one (the overhead baseline)
};

Timed Session::time_steps(int64_t warmup, int64_t n, bool read_each) {
  Timed t;
  for (int64_t i = 0; i < warmup; ++i) driver_.run_step(next_step_++);
  memory_.reset_peak();
  auto host_timed = [&](std::vector<double>* ms, std::vector<double>* wait_ms) {
    for (int64_t i = 0; i < n; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      const double wait = driver_.run_step(next_step_++);
      ms->push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      if (wait_ms != nullptr) wait_ms->push_back(wait);
    }
  };
  if (driver_.run_timed_steps) {
    for (const auto& [ms, wait] : driver_.run_timed_steps(next_step_, n)) {
      t.ms.push_back(ms);
      t.data_wait_ms.push_back(wait);
    }
    next_step_ += n;
  } else {
    host_timed(&t.ms, &t.data_wait_ms);
  }
  t.peak_gib = memory_.peak_gib();
  if (read_each) {
    if (driver_.run_timed_steps)
      host_timed(&t.read_each_ms, nullptr);
    else
      t.read_each_ms = t.ms;
  }
  return t;
}

std::unique_ptr<Tracer> Session::make_tracer() {
  const std::string want = opt_.tracer == "auto" ? (memory_.cuda ? "cupti" : "cpu") : opt_.tracer;
  if (want == "cupti") return std::make_unique<CuptiTracer>(make_cupti_activity_api());
  if (want == "cpu") return std::make_unique<CpuTracer>();
  return nullptr;
}

formats::BatchProfile Session::profile_batch(int64_t batch, bool first, TraceData* trace_out, double* traced_ms) {
  formats::BatchProfile b;
  b.batch = batch;
  driver_.set_batch(batch);
  log_ << "profile: batch " << batch << ": " << opt_.warmup << " warm-up + " << opt_.timed_steps << " timed steps"
       << std::endl;
  const Timed timed = time_steps(opt_.warmup, opt_.timed_steps, /*read_each=*/first);
  if (first) read_each_ms_ = median(timed.read_each_ms);
  b.step_ms_samples = timed.ms;
  b.step_ms = median(timed.ms);
  b.data_wait_ms_samples = timed.data_wait_ms;
  b.data_wait_ms = median(timed.data_wait_ms);
  if (memory_.cuda) b.peak_gib = timed.peak_gib;

  // Traced steps.
  std::unique_ptr<Tracer> tracer = make_tracer();
  if (tracer) {
    const ApiResult started = tracer->start();
    if (!started.ok()) {
      const std::string why =
          std::string(started.status == ApiStatus::kBusy ? "another CUPTI client (nsys, ncu, a sanitizer?) holds CUPTI"
                                                         : "CUPTI unavailable") +
          " (" + started.message + "): per-module times are missing; step times are measured";
      if (first) degraded_.push_back(why);
      log_ << "profile: " << why << std::endl;
      tracer.reset();
    } else {
      tracer_kind_ = tracer->kind();
    }
  }
  std::map<std::string, double> phase_peak;
  int64_t step_start_alloc = 0;
  double activation_sum = 0;
  ScopeRecorder recorder(
      tracer.get(),
      memory_.cuda ? std::function<int64_t()>([this] { return memory_.allocated(); }) : std::function<int64_t()>(),
      memory_.cuda);
  recorder.set_phase_listener([&](Phase ended) {
    if (memory_.cuda) {
      auto& p = phase_peak[phase_name(ended)];
      p = std::max(p, memory_.peak_gib());
      memory_.reset_peak();
      if (ended == Phase::kForward) activation_sum += static_cast<double>(memory_.allocated() - step_start_alloc);
    }
  });
  recorder.install();
  driver_.run_step(next_step_++);  // instrumentation cost (CUPTI patches kernels at first launch) paid here
  TraceData discard;
  recorder.take(&discard);
  phase_peak.clear();
  activation_sum = 0;
  if (tracer) tracer->begin_window();
  const int64_t first_traced = next_step_;
  std::vector<double> traced;
  for (int64_t i = 0; i < opt_.steps; ++i) {
    recorder.set_step(next_step_);
    recorder.reset_phase();
    memory_.reset_peak();
    step_start_alloc = memory_.allocated();
    const auto t0 = std::chrono::steady_clock::now();
    driver_.run_step(next_step_++);
    traced.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    if (memory_.cuda) {
      auto& p = phase_peak["optimizer"];
      p = std::max(p, memory_.peak_gib());
    }
  }
  if (tracer) tracer->end_window();
  recorder.uninstall();
  TraceData trace;
  if (tracer) {
    tracer->take(&trace);
    const auto unix_ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch());
    trace.unix_minus_clock_ns = static_cast<int64_t>(unix_ns.count()) - static_cast<int64_t>(tracer->now_ns());
    tracer->stop();
  }
  recorder.take(&trace);
  *traced_ms = median(traced);
  if (first && opt_.world_size >= 2 && tracer) measure_communication(trace);

  const AttributionResult a = attribute(trace, opt_.steps, module_infos(model_));
  b.modules = a.modules;
  b.kernels = a.kernels;
  b.attribution = a.attribution;
  if (a.graph_kernels > 0 && first)
    degraded_.push_back(std::to_string(a.graph_kernels) +
                        " kernels were replayed from CUDA graphs: attributed to "
                        "their launch's module only");
  for (auto& m : b.modules) m.recomputed = covered(m.fqn, baseline_);

  // Memory.
  int64_t params = 0, trainable = 0;
  for (const auto& p : model_.parameters()) {
    params += static_cast<int64_t>(p.nbytes());
    if (p.requires_grad()) trainable += static_cast<int64_t>(p.nbytes());  // frozen: no gradient (recipe freeze, LoRA)
  }
  b.memory.parameter_bytes = params;
  b.memory.gradient_bytes = opt_.inference ? 0 : trainable;  // one gradient per trainable parameter, same dtype
  if (driver_.optimizer_state_bytes) b.memory.optimizer_bytes = driver_.optimizer_state_bytes();
  if (memory_.cuda) {
    b.memory.activation_bytes = static_cast<int64_t>(activation_sum / static_cast<double>(opt_.steps));
    b.memory.peak_gib_by_phase = phase_peak;
  }
  if (trace_out) {
    // Keep the first trace_steps steps.
    uint64_t cutoff = 0;
    for (const auto& s : trace.scopes)
      if (s.step < first_traced + opt_.trace_steps) cutoff = std::max(cutoff, s.end_ns);
    TraceData kept;
    kept.names = trace.names;
    kept.correlations = trace.correlations;
    for (const auto& s : trace.scopes)
      if (s.step < first_traced + opt_.trace_steps) kept.scopes.push_back(s);
    for (const auto& x : trace.activities)
      if (x.start_ns <= cutoff) kept.activities.push_back(x);
    kept.gemms = trace.gemms;
    kept.unix_minus_clock_ns = trace.unix_minus_clock_ns;
    *trace_out = std::move(kept);
  }
  log_ << "profile: batch " << batch << ": step " << std::fixed << std::setprecision(1) << b.step_ms
       << " ms (data wait " << std::setprecision(2) << *b.data_wait_ms << " ms)";
  if (b.peak_gib) log_ << ", peak " << std::setprecision(2) << *b.peak_gib << " GiB";
  log_ << ", attributed " << std::setprecision(2) << 100.0 * b.attribution.attributed_fraction << "% of "
       << std::setprecision(1) << b.attribution.gpu_ms << " ms traced" << std::defaultfloat << std::endl;
  return b;
}

// Multi-GPU: per-group all-reduce time, bus bandwidth and exposed communication of the traced steps.
void Session::measure_communication(const TraceData& trace) {
  const CommStats c = communication_from_trace(trace, opt_.comm_groups, opt_.world_size);
  if (c.unattributed_nccl > 0)
    degraded_.push_back(std::to_string(c.unattributed_nccl) +
                        " NCCL kernels were outside any scope: not in the communication section");
  if (c.steps == 0) {
    degraded_.push_back("world size " + std::to_string(opt_.world_size) +
                        " but no NCCL kernel was traced: no communication section");
    log_ << "profile: no NCCL kernel traced; no communication section" << std::endl;
    return;
  }
  communication_ = c.communication;
  double ms = 0;
  int64_t bytes = 0;
  for (const auto& g : c.communication.groups) {
    ms += g.allreduce_ms;
    bytes += g.bytes;
  }
  log_ << "profile: communication over " << opt_.world_size << " ranks: " << c.communication.groups.size()
       << " group(s), " << std::fixed << std::setprecision(1) << static_cast<double>(bytes) / 1048576.0 << " MiB, "
       << std::setprecision(2) << ms << " ms of all-reduce per step, bus " << std::setprecision(1)
       << c.communication.allreduce_gbps << " GB/s, exposed " << std::setprecision(2) << c.communication.exposed_ms
       << " ms per step (median of " << c.exposed_ms_per_step.size() << ")" << std::defaultfloat << std::endl;
}

std::map<std::string, int64_t> Session::probe_output_bytes() {
  std::map<std::string, int64_t> out;
  if (!memory_.cuda || !driver_.forward_only) return out;
  std::vector<std::string> coarse, fine;
  for (const auto& fqn : model_.recomputable_fqns()) {
    if (layout::canonical_unit(fqn) != fqn) continue;        // the backbone name stands for it
    if (!layout::merged_gemm_module(fqn).empty()) continue;  // no scope of its own (plan: rows x N x 2 bytes)
    const std::string kind = layout::unit_kind(fqn);
    (kind == "vision_tower" || kind == "decoder_layer" ? coarse : fine).push_back(fqn);
  }
  for (const auto* selection : {&coarse, &fine}) {
    model_.set_recompute(*selection);
    ScopeRecorder recorder(
        nullptr, [this] { return memory_.allocated(); }, false);
    recorder.install();
    driver_.forward_only(next_step_);
    recorder.uninstall();
    TraceData t;
    recorder.take(&t);
    const std::set<std::string> wanted(selection->begin(), selection->end());
    for (const auto& s : t.scopes) {
      if (s.phase != Phase::kForward || s.allocated_begin < 0 || s.allocated_end < 0) continue;
      const std::string& fqn = t.names[static_cast<size_t>(s.fqn)];
      if (wanted.count(fqn)) out[fqn] = std::max<int64_t>(0, s.allocated_end - s.allocated_begin);
    }
  }
  model_.set_recompute(baseline_);
  memory_.release_cache();
  return out;
}

void Session::recompute_ab(formats::BatchProfile& b, const Timed& base) {
  auto classes = layout::recompute_classes(model_.recomputable_fqns());
  for (const auto& extra : opt_.extra_candidates) classes.push_back(extra);
  const double base_ms = median(base.ms);
  std::set<std::string> ran;  // modules that ran (dead work skipped by skip_dead has no row)
  for (const auto& m : b.modules) ran.insert(m.fqn);
  for (auto [name, fqns] : classes) {
    fqns.erase(std::remove_if(fqns.begin(), fqns.end(),
                              [&](const std::string& f) {
                                const std::string module = layout::merged_gemm_module(f);
                                return ran.count(module.empty() ? f : module) == 0;
                              }),
               fqns.end());
    if (fqns.empty()) continue;
    formats::RecomputeCandidate c;
    c.name = name;
    c.patterns = fqns;
    const std::set<std::string> in_base(baseline_.begin(), baseline_.end());
    c.added = !std::all_of(fqns.begin(), fqns.end(), [&](const std::string& f) { return in_base.count(f) > 0; });
    std::vector<std::string> selection;
    if (c.added) {
      selection = fqns;
      for (const auto& s : baseline_) {
        const bool clash = std::any_of(fqns.begin(), fqns.end(), [&](const std::string& f) {
          return f == s || layout::unit_contains(f, s) || layout::unit_contains(s, f);
        });
        if (!clash) selection.push_back(s);
      }
    } else {
      for (const auto& s : baseline_)
        if (std::find(fqns.begin(), fqns.end(), s) == fqns.end()) selection.push_back(s);
    }
    log_ << "profile: recompute A/B: " << (c.added ? "+" : "-") << name << " (" << fqns.size() << " modules)"
         << std::endl;
    try {
      model_.set_recompute(selection);
      const Timed t = time_steps(1, opt_.ab_steps);
      c.step_ms_delta = median(t.ms) - base_ms;
      c.peak_gib_delta = t.peak_gib - base.peak_gib;
      if ((c.peak_gib_delta < 0) == c.added && std::abs(c.peak_gib_delta) > 1e-3)
        c.ms_per_gib_saved = c.step_ms_delta / -c.peak_gib_delta;
      b.recompute.push_back(c);
    } catch (const c10::OutOfMemoryError&) {
      degraded_.push_back("recompute A/B '" + name + "': out of memory without it; not measured");
      log_ << "profile: recompute A/B " << name << ": out of memory, skipped" << std::endl;
    }
    memory_.release_cache();
  }
  model_.set_recompute(baseline_);
}

std::vector<formats::GemmEntry> Session::gemm_inventory(const std::vector<GemmShapeRecord>& shapes) {
  std::vector<formats::GemmEntry> out;
  std::map<std::tuple<int64_t, int64_t, int64_t>, GemmTiming> timed;
  const bool time_them = memory_.cuda && opt_.gemm_repetitions > 0;
  if (time_them) log_ << "profile: timing " << shapes.size() << " GEMMs (bf16 and FP8)" << std::endl;
  for (const auto& g : shapes) {
    formats::GemmEntry e;
    e.members = g.members;
    e.name = layout::gemm_inventory_name(g.members);
    e.m = g.m;
    e.k = g.k;
    e.n = g.n;
    e.recomputed = covered(g.members[0], baseline_);
    if (time_them) {
      const auto key = std::make_tuple(g.m, g.k, g.n);
      auto it = timed.find(key);
      if (it == timed.end()) it = timed.emplace(key, time_gemm(g.m, g.k, g.n, opt_.gemm_repetitions)).first;
      e.bf16 = it->second.bf16;
      e.fp8 = it->second.fp8;
      e.quant_ms = it->second.quant_ms;
    }
    out.push_back(std::move(e));
  }
  memory_.release_cache();
  return out;
}

TraceMetadata Session::trace_metadata() const {
  TraceMetadata meta;
  meta.process_id = ::getpid();
  meta.host_ops = tracer_kind_ == "cpu";
  meta.world_size = opt_.world_size;  // only rank 0 writes the trace
  meta.backend = memory_.cuda ? "nccl" : "gloo";
#ifdef VLATUNE_HAVE_CUDA
  cudaDeviceProp prop{};
  if (memory_.cuda && cudaGetDeviceProperties(&prop, memory_.device) == cudaSuccess) {
    DeviceProperties d;
    d.id = memory_.device;
    d.name = prop.name;
    d.total_global_mem = prop.totalGlobalMem;
    d.compute_major = prop.major;
    d.compute_minor = prop.minor;
    d.max_threads_per_block = prop.maxThreadsPerBlock;
    d.max_threads_per_multiprocessor = prop.maxThreadsPerMultiProcessor;
    d.regs_per_block = prop.regsPerBlock;
    d.regs_per_multiprocessor = prop.regsPerMultiprocessor;
    d.warp_size = prop.warpSize;
    d.shared_mem_per_block = prop.sharedMemPerBlock;
    d.shared_mem_per_multiprocessor = prop.sharedMemPerMultiprocessor;
    d.shared_mem_per_block_optin = prop.sharedMemPerBlockOptin;
    d.num_sms = prop.multiProcessorCount;
    meta.devices.push_back(d);
  }
#endif
  return meta;
}

formats::Profile Session::run() {
  formats::Profile p;
  p.environment = opt_.environment;
  p.recipe = opt_.recipe;
  p.settings.device = memory_.cuda ? "cuda" : "cpu";
  p.settings.workload = opt_.inference ? "inference" : "train";
  p.settings.data = opt_.data_label;
  p.settings.steps = opt_.steps;
  p.settings.warmup = opt_.warmup;
#ifdef VLATUNE_HAVE_CUDA
  if (memory_.cuda) {
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess)
      p.settings.gpu_memory_gib = static_cast<double>(total_bytes) / kGiB;
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, memory_.device) == cudaSuccess)
      p.settings.compute_capability = formats::ComputeCapability{prop.major, prop.minor};
  }
#endif
  for (const auto& fqn : model_.recomputable_fqns())
    if (layout::canonical_unit(fqn) == fqn) p.recomputable.push_back(fqn);

  TraceData trace;
  double traced_ms = 0;
  for (size_t i = 0; i < opt_.batches.size(); ++i) {
    const bool first = i == 0;
    try {
      double traced = 0;
      p.batches.push_back(profile_batch(opt_.batches[i], first, first ? &trace : nullptr, &traced));
      if (first) traced_ms = traced;
    } catch (const c10::OutOfMemoryError&) {
      if (first) throw;
      degraded_.push_back("batch " + std::to_string(opt_.batches[i]) + ": out of memory; not profiled");
      memory_.release_cache();
    }
  }
  formats::BatchProfile& b0 = p.batches.front();
  // Both read step by step: the traced steps cannot overlap (each step's kernels are attributed to it).
  if (tracer_kind_ != "none") p.overhead = formats::Overhead{read_each_ms_, traced_ms};

  // At the requested batch: output bytes of recomputable units, recompute A/B, GEMM inventory.
  driver_.set_batch(b0.batch);
  const auto outputs = probe_output_bytes();
  for (auto& m : b0.modules) {
    auto it = outputs.find(m.fqn);
    if (it != outputs.end()) m.output_bytes = it->second;
  }
  if (opt_.ab_steps > 0) {
    const Timed base = time_steps(1, opt_.ab_steps);
    recompute_ab(b0, base);
  }
  p.gemms = gemm_inventory(trace.gemms);

  p.communication = communication_;
  p.settings.tracer = tracer_kind_;
  p.settings.degraded = degraded_;
  if (!opt_.out_dir.empty()) {
    formats::write_profile(p, opt_.out_dir + "/profile.json");
    if (opt_.trace_steps > 0 && !trace.scopes.empty()) {
      const std::string written =
          write_chrome_trace(chrome_trace(trace, trace_metadata()), opt_.out_dir + "/trace.json.gz");
      log_ << "profile: trace " << written << std::endl;
    }
    log_ << "profile: wrote " << opt_.out_dir << "/profile.json" << std::endl;
  }
  return p;
}

}  // namespace

formats::Profile run_profile(model::Pi05Impl& model, const StepDriver& driver, const ProfileOptions& options,
                             std::ostream& log) {
  if (options.batches.empty()) throw std::invalid_argument("profile: no batch size given");
  Session session(model, driver, options, log);
  return session.run();
}

}  // namespace vlatune::profiler
