// The train loop: open (who, what, where, from which step), step (one record per step to every output), finish.
#include "trainer/train_loop.h"

#include <unistd.h>

#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <iomanip>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

#include "formats/json_error.h"
#include "formats/json_io.h"
#include "formats/metrics_jsonl.h"
#include "formats/numbers.h"
#include "formats/recipe.h"
#include "formats/run_record.h"
#include "formats/train_config.h"
#include "kernels/fp8_ops.h"
#include "model/lora.h"
#include "model/pi05.h"
#include "model/state_dict.h"
#include "trainer/checkpoint.h"
#include "trainer/data_source.h"
#include "trainer/dataset.h"
#include "trainer/distributed.h"
#include "trainer/ema.h"
#include "trainer/environment.h"
#include "trainer/evaluate.h"
#include "trainer/file_util.h"
#include "trainer/memory_cap.h"
#include "trainer/norm_stats.h"
#include "trainer/optimizer.h"
#include "trainer/recipe_apply.h"
#include "trainer/run_dir.h"
#include "trainer/run_settings.h"
#include "trainer/schedule.h"
#include "trainer/step_graph.h"
#include "trainer/step_outputs.h"
#include "trainer/tensorboard_log.h"
#include "trainer/train_step.h"

namespace vlatune::trainer {

namespace {

// SIGINT/SIGTERM: finish the step in flight, write a checkpoint, exit cleanly.
std::atomic<int> g_stop_signal{0};
extern "C" void on_stop_signal(int sig) {
  g_stop_signal.store(sig);
}

class SignalScope {
 public:
  SignalScope() {
    g_stop_signal.store(0);
    old_int_ = std::signal(SIGINT, on_stop_signal);
    old_term_ = std::signal(SIGTERM, on_stop_signal);
  }
  ~SignalScope() {
    std::signal(SIGINT, old_int_);
    std::signal(SIGTERM, old_term_);
  }

 private:
  void (*old_int_)(int) = SIG_DFL;
  void (*old_term_)(int) = SIG_DFL;
};

// ---- Everything one run holds from open to finish. ----
struct Run {
  // Who: one process, or a rank of a data-parallel job. Rank 0 alone writes the run directory and logs; the other
  // ranks log nothing but errors.
  std::optional<DistEnv> env;
  int rank = 0, world_size = 1;
  bool writer = true;
  std::ostream null_log{nullptr};  // no buffer: output is discarded
  std::ostream* log = &null_log;
  // What: the run's settings (run_settings.h); the recipe it obeys is parts.applied.effective once applied.
  RunSettings settings;
  std::unique_ptr<RunDirLock> lock;
  std::shared_ptr<ProcessGroup> dist;
  TrainingParts parts;
  WarmupCosine schedule;
  std::unique_ptr<Ema> ema;
  // Where it stands.
  int64_t first_step = 0, step = 0;
  int64_t skipped_total = 0, consecutive_nonfinite = 0;
  double peak_gib = 0.0;
  double peak_reserved_gib = 0.0;  // the caching allocator's, cached blocks included (what --max-memory caps)
  bool stop = false;
  std::chrono::steady_clock::time_point loop_start;
  std::optional<StepWatchdog> watchdog;
  std::vector<std::unique_ptr<StepOutput>> outputs;  // rank 0
  std::unique_ptr<TrainEvaluation> evaluation;       // --eval-data (every rank evaluates; rank 0 writes)
};

// ---- open ----

// Rank 0: the run directory locked for the run's life, then checked (again, now that no other run can change it)
// and, on resume, cleared of the temporaries a killed run left.
void open_run_dir(Run& run) {
  if (!run.writer) return;
  run.lock = std::make_unique<RunDirLock>(run.settings.run_dir);
  if (!run.settings.resuming) {
    check_new_run_dir(run.settings.run_dir);
    return;
  }
  own_checkpoints(run.settings.run_dir, run.settings.config.run_id);
  for (const std::string& line : remove_leftover_temporaries(run.settings.run_dir)) *run.log << line << "\n";
}

// Step 0 (new weights, or --init-weights), or the newest checkpoint of a resumed run.
void load_start(Run& run) {
  TrainingParts& parts = run.parts;
  if (!run.settings.resume_from) {
    if (run.settings.resuming)
      *run.log << "no checkpoint yet in " << run.settings.run_dir << ": the run starts again from step 0\n";
    return;
  }
  formats::CheckpointExpectations expected;
  expected.run_id = run.settings.config.run_id;
  expected.max_next_step = run.settings.config.steps;
  expected.seed = run.settings.config.seed;
  expected.optimizer_precision = parts.precision;
  expected.ema = run.ema != nullptr;
  CheckpointContents ck = read_checkpoint(*run.settings.resume_from, *parts.net, expected);
  try {
    parts.optimizer->load_state_dict(ck.optimizer);
  } catch (const std::invalid_argument& e) {
    throw TrainInputError(*run.settings.resume_from + ": " + e.what());
  }
  if (run.ema) run.ema->load_state(ck.ema);
  run.first_step = ck.state.next_step;
  run.skipped_total = ck.state.skipped_steps;
  if (ck.state.data_fingerprint != parts.source->position().fingerprint)
    throw TrainInputError("--resume " + run.settings.run_dir + ": the data differs from the run's (" +
                          parts.source->describe() + ")");
  *run.log << "resumed " << run.settings.run_dir << " from " << *run.settings.resume_from << " at step "
           << run.first_step << "\n";
}

// Rank 0: the run's settings and effective recipe, and the per-step outputs.
void open_outputs(Run& run) {
  if (!run.writer) return;
  formats::write_train_config(run.settings.config, join_path(run.settings.run_dir, "train_config.json"));
  formats::write_recipe(run.parts.applied.effective, join_path(run.settings.run_dir, "recipe.json"));
  const std::string metrics_path = join_path(run.settings.run_dir, "metrics.jsonl");
  run.outputs.push_back(make_metrics_output(run.settings.resuming && path_exists(metrics_path)
                                                ? formats::MetricsWriter::resume(metrics_path, run.first_step - 1)
                                                : formats::MetricsWriter::create(metrics_path)));
  if (run.settings.options.tensorboard)
    run.outputs.push_back(
        make_tensorboard_output(run.settings.run_dir, run.first_step, run.settings.resuming, *run.log));
  const bool bar = run.settings.options.progress_bar.value_or(::isatty(STDERR_FILENO) == 1);
  run.outputs.push_back(make_log_output(*run.log, bar, run.settings.options.log_every, run.parts.device.is_cuda()));
}

void log_start(const Run& run) {
  const TrainingParts& parts = run.parts;
  std::ostream& log = *run.log;
  log << "vlatune train: " << parts.config_name << " Pi0.5 on " << parts.device << ", " << parts.source->describe()
      << ", batch " << parts.batch << " x " << parts.grad_accum;
  if (run.dist) log << " x " << run.world_size << " processes";
  log << ", precision " << parts.precision << ", steps " << run.first_step << ".." << run.settings.config.steps
      << ", recompute " << parts.applied.recompute.size() << " module(s), fp8 " << parts.applied.fp8.size()
      << " Linear(s)";
  if (!parts.applied.frozen.empty()) log << ", frozen " << parts.applied.frozen.size() << " module(s)";
  if (!parts.applied.lora.empty()) log << ", LoRA " << parts.applied.lora.size() << " Linear(s)";
  log << ", run dir " << run.settings.run_dir << "\n";
  if (run.dist) {
    const auto& groups = parts.buckets->groups();
    int64_t bytes = 0, dense_bytes = 0;
    for (const auto& g : groups) bytes += g.bytes, dense_bytes += g.dense_bytes;
    log << "data-parallel: " << run.world_size << " processes (" << run.dist->env().launcher << ", "
        << run.dist->backend_name() << "), gradients in " << groups.size() << " bucket(s) of "
        << parts.applied.reduce_dtype << " (" << std::fixed << std::setprecision(1) << bytes / 1048576.0
        << " MiB all-reduced of " << dense_bytes / 1048576.0 << std::defaultfloat << " MiB), "
        << (run.settings.config.dist_buckets == "one" ? "one all-reduce after backward"
                                                      : "all-reduced per group during backward")
        << "\n";
  }
}

void open_run(Run& run, const TrainOptions& caller, std::ostream& caller_log) {
  // 1. Who: one process, or a rank of a data-parallel job (trainer/distributed.h).
  run.env = job_environment();
  run.world_size = run.env ? run.env->world_size : 1;
  run.rank = run.env ? run.env->rank : 0;
  run.writer = run.rank == 0;
  run.log = run.writer ? &caller_log : &run.null_log;

  // 2. What: a new run's settings, or the saved ones of the run being resumed; every rank checks them alike.
  run.settings = run_settings(caller, run.world_size, *run.log);
  drop_fp8_without_hardware(run.settings.recipe, run.settings.options.device, *run.log);

  // 3. Where: the run directory, locked and checked (rank 0).
  open_run_dir(run);

  // 4. The job's rendezvous (after the checks above, which every rank makes alike).
  if (run.env)
    run.dist = join_job(*run.env, run.settings.options.device, run.settings.options.dist_timeout_s, *run.log);

  // 5. Model, recipe, data, optimizer (train_step.h); schedule and EMA.
  const TrainOptions& options = run.settings.options;
  const formats::Recipe& recipe = run.settings.recipe;
  try {
    run.parts = build_training_parts(options, recipe, run.settings.recipe_label,
                                     /*load_init_weights=*/!run.settings.resume_from, *run.log, run.dist);
  } catch (const c10::OutOfMemoryError& e) {
    throw std::runtime_error(out_of_memory_message(
        "setting up the model, data and optimizer state", options.batch.value_or(recipe.batch.micro_batch),
        options.grad_accum.value_or(recipe.batch.grad_accum), options.max_memory_gib, recipe, run.settings.recipe_label,
        e.what_without_backtrace()));
  }
  run.settings.config.config = run.parts.config_name;
  run.schedule = WarmupCosine{run.settings.config.warmup_steps, run.settings.config.lr, run.settings.config.decay_steps,
                              run.settings.config.decay_lr};
  if (run.settings.config.ema_decay > 0)
    run.ema = std::make_unique<Ema>(run.parts.named_params, run.settings.config.ema_decay);
  run.evaluation = TrainEvaluation::open(caller, run.parts, *run.log);  // --eval-data: the caller's, on resume too

  // 6. Where to start.
  load_start(run);
  run.step = run.first_step;

  // 7. Every rank has passed its checks and read its start before rank 0 writes anything.
  if (run.dist) run.dist->barrier("start-up barrier");
  open_outputs(run);
  log_start(run);
}

// ---- step ----

// Rank 0 alone writes checkpoints (every rank holds the same parameters; a sharded optimizer state is gathered
// from every rank first).
std::string save_checkpoint(Run& run, int64_t next_step) {
  if (!run.writer && !run.parts.optimizer->sharded()) return {};
  CheckpointContents ck;
  ck.optimizer = optimizer_state(run.parts);
  if (!run.writer) return {};
  if (run.ema) ck.ema = run.ema->state();
  ck.state.run_id = run.settings.config.run_id;
  ck.state.next_step = next_step;
  ck.state.skipped_steps = run.skipped_total;
  ck.state.data_fingerprint = run.parts.source->position().fingerprint;
  ck.state.seed = run.settings.config.seed;
  ck.state.lr_next = run.schedule.lr(next_step);
  const std::string dir = write_checkpoint(run.settings.run_dir, *run.parts.net, ck);
  for (const std::string& warning : prune_checkpoints(run.settings.run_dir, run.settings.config.run_id,
                                                      static_cast<int>(run.settings.config.keep_last)))
    *run.log << "warning: " << warning << "\n";
  return dir;
}

// A step queued on the device whose results are not read yet (train_step.h QueuedStep), or a replayed graph's
// step, read already.
struct PendingStep {
  int64_t step = 0;
  double lr = 0.0;
  QueuedStep queued;
  std::optional<StepOutcome> replayed;
  std::optional<c10::Event> start;  // CUDA: before the step's first work, with timing
  std::chrono::steady_clock::time_point t0;
  double host_ms = 0.0;  // CPU: the step's time (the work runs while it is queued)
  double peak_gib = 0.0;
};

// May step + 1 be queued before the results of `step` are read? Not where something between the two needs the
// weights after `step` alone (an evaluation, a checkpoint), nor at the end or after a stop request. Not with EMA
// (its update is conditioned on the host-read skip), a data-parallel job (the ranks agree on the loss and on
// stopping after each step) or replayed graphs (which read their results themselves); not with --no-step-overlap.
bool may_queue_next(const Run& run, int64_t step) {
  const formats::TrainConfig& c = run.settings.config;
  if (!run.settings.options.overlap_steps || run.dist || run.ema || run.parts.step_graph) return false;
  const int64_t next = step + 1;
  if (next >= c.steps || g_stop_signal.load() != 0) return false;
  if (run.evaluation && run.evaluation->due(step, c.steps)) return false;
  return !(c.save && c.checkpoint_every > 0 && next % c.checkpoint_every == 0);
}

// Queues step `step` (batch -> forward -> backward -> clip + AdamW); `in_flight`: the step before it, not read yet.
PendingStep queue_step(Run& run, int64_t step, const PendingStep* in_flight) {
  TrainingParts& parts = run.parts;
  const torch::Device device = parts.device;
  PendingStep p;
  p.step = step;
  p.lr = run.schedule.lr(step);
  reset_peak_allocated(device);
  p.t0 = std::chrono::steady_clock::now();
  if (device.is_cuda()) {
    c10::impl::VirtualGuardImpl guard(device.type());
    p.start.emplace(device.type(), c10::EventFlag::BACKEND_DEFAULT);
    p.start->record(guard.getStream(device));
  }
  try {
    if (parts.step_graph)
      p.replayed = parts.step_graph->run(parts, step, p.lr, run.settings.config.clip_norm);
    else
      p.queued = queue_train_step(parts, step, p.lr, run.settings.config.clip_norm,
                                  in_flight != nullptr ? &in_flight->queued : nullptr);
  } catch (const c10::OutOfMemoryError& e) {
    if (step == run.first_step)
      throw std::runtime_error(out_of_memory_message("in the first step", parts.batch, parts.grad_accum,
                                                     run.settings.options.max_memory_gib, parts.applied.effective,
                                                     run.settings.recipe_label, e.what_without_backtrace()));
    throw;
  }
  p.host_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - p.t0).count();
  p.peak_gib = peak_allocated_gib(device);  // the allocator's count: every allocation of the step was made
  return p;
}

// Reads step `p` (waiting for its work only), then EMA; timed from its start event to the end of its work on CUDA;
// the ranks agree on the loss and on stopping.
StepRecord finish_step(Run& run, PendingStep& p) {
  TrainingParts& parts = run.parts;
  const torch::Device device = parts.device;
  StepRecord r;
  r.step = p.step;
  r.total_steps = run.settings.config.steps;
  r.lr = p.lr;
  StepOutcome outcome = p.replayed ? *p.replayed : finish_train_step(parts, p.queued);
  const auto ema_t0 = std::chrono::steady_clock::now();
  const bool ema_update = !outcome.optimizer.skipped && run.ema;
  if (ema_update) run.ema->update();
  if (device.is_cuda()) {
    // The step ends at its `done` event (queued behind its results' copy), moved behind the EMA update when there
    // is one; a replayed step gets one now (its run read the results: nothing of it is queued any more).
    c10::impl::VirtualGuardImpl guard(device.type());
    std::optional<c10::Event>& done = p.queued.done;
    if (!done) done.emplace(device.type(), c10::EventFlag::BACKEND_DEFAULT);
    if (ema_update || p.replayed) done->record(guard.getStream(device));
    done->synchronize();
    r.step_ms = static_cast<double>(p.start->elapsedTime(*done));
  } else {
    r.step_ms =
        p.host_ms + std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - ema_t0).count();
  }
  r.loss = outcome.loss;
  if (run.dist) {
    // The mean loss over ranks (what one process would log) and whether any rank was asked to stop, in one
    // all-reduce, so that every rank leaves the loop after the same step.
    torch::Tensor t = torch::tensor({r.loss, g_stop_signal.load() != 0 ? 1.0 : 0.0}, torch::kFloat64).to(device);
    run.dist->allreduce_sum_blocking(t, "all-reduce of the step's loss");
    t = t.cpu();
    r.loss = t[0].item<double>() / run.world_size;
    run.stop = t[1].item<double>() > 0;
  } else {
    run.stop = g_stop_signal.load() != 0;
  }
  if (run.watchdog) run.watchdog->step_done();
  r.grad_norm = outcome.optimizer.grad_norm;
  r.data_wait_ms = outcome.wait_ms;
  r.skipped = outcome.optimizer.skipped || !std::isfinite(r.loss);
  // A replayed graph allocates nothing: its peak is the capture's.
  r.peak_gib = std::max(p.peak_gib, outcome.graph_peak_gib);
  run.peak_gib = std::max(run.peak_gib, r.peak_gib);
  run.peak_reserved_gib = std::max(run.peak_reserved_gib, peak_reserved_gib(device));
  const int64_t samples_per_step = parts.batch * parts.grad_accum * run.world_size;  // the global batch
  r.samples_per_s = samples_per_step / (r.step_ms / 1e3);
  const double elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - run.loop_start).count();
  r.eta_s = elapsed_s / static_cast<double>(p.step - run.first_step + 1) *
            static_cast<double>(run.settings.config.steps - p.step - 1);
  return r;
}

// A non-finite loss or gradient norm skipped the update (the optimizer wrote nothing); too many in a row stop.
void guard_nonfinite(Run& run, const StepRecord& r) {
  if (!r.skipped) {
    run.consecutive_nonfinite = 0;
    return;
  }
  ++run.skipped_total;
  ++run.consecutive_nonfinite;
  *run.log << "step " << r.step << ": non-finite " << (std::isfinite(r.loss) ? "gradient norm" : "loss")
           << ", update skipped (" << run.consecutive_nonfinite << " in a row)\n";
  if (run.consecutive_nonfinite >= run.settings.config.max_consecutive_nonfinite)
    throw std::runtime_error("stopping: " + std::to_string(run.consecutive_nonfinite) +
                             " consecutive steps with a non-finite loss or gradient norm (last at step " +
                             std::to_string(r.step) + "); lower --lr or check the data's normalization");
}

// ---- finish ----

// Every rank applied the same averaged gradients to the same weights: check that they still agree (a sum and an
// absolute sum of all parameters per rank, gathered in one all-reduce), once, at the end.
void check_ranks_agree(Run& run) {
  TrainingParts& parts = run.parts;
  parts.buckets->check_row_bounds();  // the last step's row-sparse gradients fitted their capacity
  torch::NoGradGuard no_grad;
  torch::Tensor slots =
      torch::zeros({2 * run.world_size}, torch::TensorOptions().dtype(torch::kFloat64).device(parts.device));
  for (const auto& item : parts.named_params) {
    torch::Tensor d = item.second.detach().to(torch::kFloat64);
    slots[2 * run.rank] += d.sum();
    slots[2 * run.rank + 1] += d.abs().sum();
  }
  run.dist->allreduce_sum_blocking(slots, "all-reduce of the parameter checksums");
  slots = slots.cpu();
  const double* c = slots.data_ptr<double>();
  for (int r = 1; r < run.world_size; ++r) {
    if (c[2 * r] != c[0] || c[2 * r + 1] != c[1]) {
      std::ostringstream os;
      os << std::setprecision(17) << "distributed: the parameters differ across ranks after step " << run.step
         << ": rank 0 checksum " << c[0] << " / " << c[1] << ", rank " << r << " " << c[2 * r] << " / " << c[2 * r + 1];
      throw DistributedError(os.str());
    }
  }
  *run.log << "data-parallel: parameters identical on all " << run.world_size << " ranks (checksum "
           << std::setprecision(17) << c[0] << std::defaultfloat << std::setprecision(6) << ")\n";
}

// The final weights: model.safetensors in the openpi layout, LoRA adapters merged in; with LoRA also the adapters
// alone (adapters.safetensors, model/lora.h).
void save_final_weights(const model::Pi05Impl& net, const std::string& final_dir, const char* weights) {
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"weights", weights}};
  if (model::lora_adapters(net).empty()) {
    model::save_state_dict(net, join_path(final_dir, "model.safetensors"), meta);
    return;
  }
  model::save_merged_state_dict(net, join_path(final_dir, "model.safetensors"), meta);
  model::save_lora_adapters(net, join_path(final_dir, "adapters.safetensors"));
}

// final/model.safetensors (the EMA weights when on: what openpi saves for inference), with LoRA
// final/adapters.safetensors, and final/norm_stats.json.
void write_final(Run& run) {
  const std::string final_dir = join_path(run.settings.run_dir, "final");
  make_directories(final_dir);
  auto& net = run.parts.net;
  const auto& named_params = run.parts.named_params;
  if (!run.settings.config.save) {
    // Benchmark run: the weights are not needed (a full Pi0.5 checkpoint is ~20 GB of disk writes).
  } else if (run.ema) {
    std::vector<std::pair<std::string, torch::Tensor>> live;
    for (const auto& [name, t] : named_params) live.emplace_back(name, t.detach().clone());
    run.ema->apply_to_params();
    save_final_weights(*net, final_dir, "ema");
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < live.size(); ++i) named_params[i].second.copy_(live[i].second);
  } else {
    save_final_weights(*net, final_dir, "last");
  }
  if (run.settings.options.data != "synthetic") {
    // The manifest alone: Dataset::open would hash every shard again (tens of GiB for a LeRobot import).
    const NormStats norm = read_manifest(join_path(run.settings.options.data, "manifest.json")).norm;
    formats::write_file_atomic(join_path(final_dir, "norm_stats.json"), norm_stats_file_json(norm).dump(2) + "\n");
  }
}

// run.json over the whole run, every segment of it: the per-step series come from metrics.jsonl (which a resume
// truncates to its checkpoint and continues), the skipped steps from the checkpoints.
formats::RunRecord run_record(Run& run) {
  const TrainingParts& parts = run.parts;
  const int64_t samples_per_step = parts.batch * parts.grad_accum * run.world_size;
  formats::RunRecord rec;
  rec.schema = formats::kRunSchema;
  rec.steps = run.step;
  rec.warmup_steps = std::min<int64_t>(run.settings.config.timing_warmup, run.step);
  rec.skipped_steps = run.skipped_total;
  rec.batch = samples_per_step;
  rec.seed = static_cast<int64_t>(run.settings.config.seed);
  rec.data = run.settings.config.data;
  double peak = 0.0;
  for (const formats::MetricsRow& row : formats::read_metrics(join_path(run.settings.run_dir, "metrics.jsonl"))) {
    peak = std::max(peak, row.peak_gib);
    if (row.step < rec.warmup_steps) continue;
    rec.step_ms.push_back(row.step_ms);
    rec.loss.push_back(row.loss);
    rec.grad_norm.push_back(row.grad_norm);
  }
  if (!rec.step_ms.empty()) rec.samples_per_s_median = samples_per_step / (formats::median(rec.step_ms) / 1e3);
  if (parts.device.is_cuda()) rec.peak_gib = peak;
  rec.environment = capture_environment(parts.device, parts.config_name, formats::recipe_hash(parts.applied.effective),
                                        run.world_size);
  return rec;
}

// A planned recipe carries the tuner's prediction: say how close it came (the plan's validation, goal 10%), for
// the recipe as planned (an override drops the prediction: recipe_apply.h) and the world size it planned for.
void log_plan_check(const Run& run, const formats::RunRecord& rec) {
  const formats::Recipe& recipe = run.parts.applied.effective;
  const formats::Recipe::Predicted& predicted = recipe.predicted;
  if (!predicted.step_ms || rec.step_ms.empty() || run.world_size != recipe.distributed.world_size) return;
  std::ostream& log = *run.log;
  auto versus = [&log](const char* what, double measured, double predicted, const char* unit) {
    const double off_pct = 100.0 * (predicted / measured - 1.0);
    log << what << " measured " << std::fixed << std::setprecision(2) << measured << " " << unit << ", predicted "
        << predicted << " " << unit << " (the prediction is " << std::setprecision(1) << std::fabs(off_pct) << "% "
        << (off_pct >= 0 ? "above" : "below") << " the measurement)" << std::defaultfloat;
  };
  versus("plan: step time", formats::median(rec.step_ms), *predicted.step_ms, "ms");
  if (predicted.peak_gib && rec.peak_gib && *rec.peak_gib > 0)
    versus("; peak memory", *rec.peak_gib, *predicted.peak_gib, "GiB");
  // The planner prices the profiled prompts; trimming makes shorter ones cheaper than that.
  if (recipe.data.trim_text)
    log << " (data.trim_text: steps whose prompts are shorter than the profiled ones run faster and lighter than "
           "predicted)";
  log << "\n";
}

TrainSummary finish_run(Run& run) {
  for (auto& output : run.outputs) output->finish();
  TrainSummary summary;
  summary.run_dir = run.settings.run_dir;
  summary.first_step = run.first_step;
  summary.last_step = run.step;
  summary.skipped_steps = run.skipped_total;
  summary.interrupted = run.stop;
  summary.rank = run.rank;
  summary.world_size = run.world_size;
  summary.peak_gib = run.peak_gib;
  if (run.dist) check_ranks_agree(run);
  run.watchdog.reset();  // past the last collective: the writes below may take longer than a step
  std::ostream& log = *run.log;
  if (run.settings.config.save) {
    const std::string ck_dir = save_checkpoint(run, run.step);
    if (summary.interrupted)
      log << "interrupted by a signal after step " << run.step << "; checkpoint " << ck_dir
          << "; continue with: vlatune train --resume " << run.settings.run_dir << "\n";
  } else if (summary.interrupted) {
    log << "interrupted by a signal after step " << run.step << " (--no-save: no checkpoint to resume from)\n";
  }
  if (!run.writer) return summary;  // the rest is rank 0's: final weights, norm stats, run.json

  write_final(run);
  run.outputs.clear();  // metrics.jsonl closed before it is read back
  const formats::RunRecord rec = run_record(run);
  formats::write_run_record(rec, join_path(run.settings.run_dir, "run.json"));
  if (rec.samples_per_s_median) summary.samples_per_s_median = *rec.samples_per_s_median;
  log << "done: steps " << run.first_step << ".." << run.step << ", median ";
  if (rec.step_ms.empty())
    log << "n/a (no step after the " << run.settings.config.timing_warmup << " timing warm-up steps)";
  else
    log << std::fixed << std::setprecision(2) << summary.samples_per_s_median << " samples/s" << std::defaultfloat
        << (run.dist ? " (global: all " + std::to_string(run.world_size) + " processes)" : std::string());
  if (run.parts.device.is_cuda())
    log << ", peak " << std::fixed << std::setprecision(2) << run.peak_gib << " GiB (" << run.peak_reserved_gib
        << " GiB reserved by the caching allocator)" << std::defaultfloat;
  log << ", skipped " << run.skipped_total << "; " << join_path(run.settings.run_dir, "run.json") << "\n";
  if (run.parts.step_graph) {
    const StepGraph::Stats& g = run.parts.step_graph->stats();
    log << "cuda graph: " << g.replays << " step(s) replayed, " << g.eager_steps << " eager, " << g.captures
        << " capture(s)" << (g.disabled.empty() ? std::string() : "; capture given up: " + g.disabled) << "\n";
  }
  if (run.parts.applied.effective.fp8.gemm_algorithm == formats::Fp8GemmAlgorithm::kTimed) {
    const std::string timed = kernels::describe_fp8_timed_gemms(kernels::fp8_timed_gemms(), run.step - run.first_step);
    if (!timed.empty()) log << timed << "\n";
  }
  log_plan_check(run, rec);
  return summary;
}

}  // namespace

TrainSummary run_training(const TrainOptions& options, std::ostream& log) {
  Run run;
  open_run(run, options, log);

  SignalScope signals;
  run.stop = !run.dist && g_stop_signal.load() != 0;  // data-parallel: the ranks agree after each step
  run.loop_start = std::chrono::steady_clock::now();
  if (run.dist)
    run.watchdog.emplace(run.rank, run.world_size,
                         std::chrono::milliseconds(static_cast<int64_t>(run.settings.options.dist_timeout_s * 1000.0)));
  // Step n + 1 is queued before step n is read where nothing in between needs the weights after n
  // (may_queue_next): the host prepares the next batch and queues the next step while the GPU still runs this one.
  std::optional<PendingStep> pending;
  while (pending || (run.step < run.settings.config.steps && !run.stop)) {
    if (!pending) pending = queue_step(run, run.step, nullptr);
    std::optional<PendingStep> next_step;
    if (may_queue_next(run, pending->step)) next_step = queue_step(run, pending->step + 1, &*pending);
    const StepRecord record = finish_step(run, *pending);
    run.step = record.step + 1;  // steps done
    for (auto& output : run.outputs) output->write_step(record);
    if (auto row = run.evaluation
                       ? run.evaluation->after_step(record.step, run.settings.config.steps, *run.parts.net, *run.log)
                       : std::nullopt)
      for (auto& output : run.outputs) output->write_eval(*row);
    guard_nonfinite(run, record);
    if (run.settings.config.save && run.settings.config.checkpoint_every > 0 &&
        run.step % run.settings.config.checkpoint_every == 0 && run.step < run.settings.config.steps)
      save_checkpoint(run, run.step);
    pending = std::move(next_step);
  }
  return finish_run(run);
}

}  // namespace vlatune::trainer
