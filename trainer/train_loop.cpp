// The train loop. Reads top to bottom: setup, resume, the step loop, the end of the run.
#include "trainer/train_loop.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <fstream>
#include <iomanip>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "formats/json_error.h"
#include "formats/json_io.h"
#include "formats/metrics_jsonl.h"
#include "formats/recipe.h"
#include "formats/run_record.h"
#include "kernels/cudnn_sdpa.h"
#include "kernels/gemm_tuned.h"
#include "model/pi05.h"
#include "model/state_dict.h"
#include "trainer/checkpoint.h"
#include "trainer/data_source.h"
#include "trainer/dataset.h"
#include "trainer/distributed.h"
#include "trainer/ema.h"
#include "trainer/environment.h"
#include "trainer/file_util.h"
#include "trainer/memory_cap.h"
#include "trainer/norm_stats.h"
#include "trainer/optimizer.h"
#include "trainer/recipe_apply.h"
#include "trainer/schedule.h"
#include "trainer/step_graph.h"
#include "trainer/train_step.h"

namespace vlatune::trainer {

namespace {

constexpr const char* kTrainConfigSchema = "vlatune.train_config/1";

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

// The options a run was started with, so that --resume continues with exactly the same settings.
nlohmann::json options_to_json(const TrainOptions& o, int64_t batch, int64_t grad_accum, const std::string& precision,
                               int64_t steps) {
  return {{"schema", kTrainConfigSchema},
          {"config", o.config},
          {"data", o.data},
          {"recipe", o.recipe_path},
          {"init_weights", o.init_weights},
          {"device", o.device},
          {"batch", batch},
          {"grad_accum", grad_accum},
          {"precision", precision},
          {"steps", steps},
          {"lr", o.lr},
          {"warmup_steps", o.warmup_steps},
          {"decay_steps", o.decay_steps},
          {"decay_lr", o.decay_lr.value_or(o.lr)},
          {"clip_norm", o.clip_norm},
          {"weight_decay", o.weight_decay},
          {"beta1", o.beta1},
          {"beta2", o.beta2},
          {"eps", o.eps},
          {"ema_decay", o.ema_decay},
          {"loss_action_dim", o.loss_action_dim},
          {"seed", o.seed},
          {"timing_warmup", o.timing_warmup},
          {"checkpoint_every", o.checkpoint_every},
          {"keep_last", o.keep_last},
          {"max_consecutive_nonfinite", o.max_consecutive_nonfinite},
          {"workers", o.workers},
          {"augment", o.augment}};
}

// Options for --resume: the saved ones, with a new --steps (to extend a run) and bookkeeping flags from the caller.
TrainOptions options_from_json(const nlohmann::json& j, const TrainOptions& caller, const std::string& file) {
  try {
    if (j.at("schema") != kTrainConfigSchema)
      throw formats::FormatError(file, "$.schema", "expected '" + std::string(kTrainConfigSchema) + "'");
    TrainOptions o = caller;
    o.config = j.at("config");
    o.data = j.at("data");
    o.recipe_path = j.at("recipe");
    o.init_weights = j.at("init_weights");
    o.device = j.at("device");
    o.batch = j.at("batch").get<int64_t>();
    o.grad_accum = j.at("grad_accum").get<int64_t>();
    o.precision = j.at("precision").get<std::string>();
    if (!caller.steps) o.steps = j.at("steps").get<int64_t>();
    o.lr = j.at("lr");
    o.warmup_steps = j.at("warmup_steps");
    o.decay_steps = j.at("decay_steps");
    o.decay_lr = j.at("decay_lr").get<double>();
    o.clip_norm = j.at("clip_norm");
    o.weight_decay = j.at("weight_decay");
    o.beta1 = j.at("beta1");
    o.beta2 = j.at("beta2");
    o.eps = j.at("eps");
    o.ema_decay = j.at("ema_decay");
    o.loss_action_dim = j.at("loss_action_dim");
    o.seed = j.at("seed");
    o.timing_warmup = j.at("timing_warmup");
    o.checkpoint_every = j.at("checkpoint_every");
    o.keep_last = j.at("keep_last");
    o.max_consecutive_nonfinite = j.at("max_consecutive_nonfinite");
    o.workers = j.at("workers");
    o.augment = j.at("augment");
    // Data-parallel settings (absent in runs written before them: the defaults).
    o.dist_buckets = j.value("dist_buckets", caller.dist_buckets);
    if (j.contains("reduce_dtype")) o.reduce_dtype = j.at("reduce_dtype").get<std::string>();
    if (j.contains("cuda_graph")) o.cuda_graph = j.at("cuda_graph").get<std::string>();
    return o;
  } catch (const nlohmann::json::exception& e) {
    throw formats::FormatError(file, "$", std::string("not a train_config written by vlatune: ") + e.what());
  }
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<int64_t>(seconds + 0.5);
  std::ostringstream os;
  if (s >= 3600)
    os << s / 3600 << "h" << std::setw(2) << std::setfill('0') << (s % 3600) / 60 << "m";
  else if (s >= 60)
    os << s / 60 << "m" << std::setw(2) << std::setfill('0') << s % 60 << "s";
  else
    os << s << "s";
  return os.str();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

TrainSummary run_training(const TrainOptions& caller_options, std::ostream& caller_log) {
  // ---- 0. One process, or a rank of a data-parallel job (trainer/distributed.h): rank 0 alone writes the run
  // directory and logs; the other ranks log nothing but errors. ----
  std::optional<DistEnv> dist_env;
  try {
    dist_env = dist_env_from_process();
  } catch (const std::invalid_argument& e) {
    throw TrainInputError(std::string("distributed launch environment: ") + e.what());
  }
  const int world_size = dist_env ? dist_env->world_size : 1;
  const int rank = dist_env ? dist_env->rank : 0;
  const bool writer = rank == 0;
  std::ostream null_log(nullptr);  // no buffer: output is discarded
  std::ostream& log = writer ? caller_log : null_log;

  // ---- 1. Options: a new run, or the saved options of the run being resumed. ----
  TrainOptions opt = caller_options;
  const bool resuming = !caller_options.resume.empty();
  std::string run_dir = resuming ? caller_options.resume : caller_options.out;
  if (run_dir.empty()) throw TrainInputError("--out RUNDIR is required (or --resume RUNDIR)");
  const std::string config_path = join_path(run_dir, "train_config.json");
  if (resuming) {
    if (!path_exists(config_path))
      throw TrainInputError("--resume " + run_dir + ": no train_config.json there (not a vlatune run directory)");
    const nlohmann::json saved = formats::read_json_file(config_path);
    opt = options_from_json(saved, caller_options, config_path);
    // Another world size: the same per-process micro-batch, and as many micro-batches per process as keep the
    // global batch (micro-batch x grad_accum x world size) and so the data order, schedule and numerics' scale.
    const int saved_world = saved.value("world_size", 1);
    if (saved_world != world_size) {
      const int64_t micro_batches = *opt.grad_accum * saved_world;
      if (micro_batches % world_size != 0)
        throw TrainInputError("--resume " + run_dir + ": the run's global batch is " + std::to_string(micro_batches) +
                              " micro-batches of " + std::to_string(*opt.batch) + " (grad_accum " +
                              std::to_string(*opt.grad_accum) + " x " + std::to_string(saved_world) + " processes); " +
                              std::to_string(world_size) +
                              " processes cannot share them evenly: resume with a world size that divides " +
                              std::to_string(micro_batches));
      log << "resuming a " << saved_world << "-process run on " << world_size << ": grad_accum " << *opt.grad_accum
          << " -> " << micro_batches / world_size << " (same global batch)\n";
      opt.grad_accum = micro_batches / world_size;
    }
  } else if (path_exists(join_path(run_dir, "train_config.json"))) {
    throw TrainInputError("--out " + run_dir + ": already holds a run; continue it with --resume " + run_dir +
                          " or choose another directory");
  }
  if (!opt.steps || *opt.steps < 1) throw TrainInputError("--steps N (>= 1) is required for a new run");

  formats::Recipe recipe;
  const std::string recipe_label = opt.recipe_path.empty() ? std::string("<default recipe>") : opt.recipe_path;
  if (!opt.recipe_path.empty()) recipe = formats::read_recipe(opt.recipe_path);  // FormatError names the path
  drop_fp8_without_hardware(recipe, opt.device, log);

  // Rendezvous and process group (after the option checks, which every rank makes alike).
  std::shared_ptr<ProcessGroup> dist;
  if (dist_env) {
    if (!(opt.dist_timeout_s > 0)) throw TrainInputError("--dist-timeout must be > 0 seconds");
    torch::Device device{torch::kCPU};
    try {
      device = bind_process_device(resolve_device("--device", opt.device), *dist_env);
    } catch (const std::invalid_argument& e) {
      throw TrainInputError(e.what());
    }
    if (device.is_cuda()) {
      const std::string warning = set_nccl_environment();
      if (!warning.empty()) log << "warning: " << warning << "\n";
    }
    const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(opt.dist_timeout_s * 1000.0));
    dist = ProcessGroup::create(*dist_env, device, timeout);
  }

  // ---- 2-4. Model, recipe, data, optimizer (train_step.cpp); schedule and EMA. ----
  TrainingParts parts;
  try {
    parts = build_training_parts(opt, recipe, recipe_label, /*load_init_weights=*/!resuming, log, dist);
  } catch (const c10::OutOfMemoryError& e) {
    throw std::runtime_error(out_of_memory_message("setting up the model, data and optimizer state",
                                                   opt.batch.value_or(recipe.batch.micro_batch),
                                                   opt.grad_accum.value_or(recipe.batch.grad_accum), opt.max_memory_gib,
                                                   recipe, recipe_label, e.what_without_backtrace()));
  }
  const torch::Device device = parts.device;
  const bool cuda = device.is_cuda();
  const int64_t batch = parts.batch, grad_accum = parts.grad_accum;
  const std::string precision = parts.precision;
  model::Pi05& net = parts.net;
  const AppliedRecipe& applied = parts.applied;
  std::unique_ptr<DataSource>& source = parts.source;
  const auto& named_params = parts.named_params;
  AdamW& optimizer = *parts.optimizer;
  WarmupCosine schedule{opt.warmup_steps, opt.lr, opt.decay_steps, opt.decay_lr.value_or(opt.lr)};
  try {
    schedule.validate();
  } catch (const std::invalid_argument& e) {
    throw TrainInputError(e.what());
  }
  std::unique_ptr<Ema> ema;
  if (opt.ema_decay > 0) ema = std::make_unique<Ema>(named_params, opt.ema_decay);

  // ---- 5. Run directory: new, or resumed from its newest checkpoint. ----
  int64_t first_step = 0;
  std::vector<double> timing_step_ms, timing_loss, timing_grad_norm;
  int64_t skipped_total = 0;
  if (writer) make_directories(run_dir);
  if (resuming) {
    auto latest = latest_checkpoint(run_dir);
    if (!latest) throw TrainInputError("--resume " + run_dir + ": no checkpoint to resume from");
    CheckpointContents ck = read_checkpoint(*latest, *net);
    optimizer.load_state_dict(ck.optimizer);
    if (ema) ema->load_state(ck.ema);
    first_step = ck.next_step;
    skipped_total = ck.trainer_state.value("skipped_steps", int64_t{0});
    const std::string fingerprint = ck.trainer_state.value("data_fingerprint", std::string());
    if (fingerprint != source->position().fingerprint)
      throw TrainInputError("--resume " + run_dir + ": the data differs from the run's (" + source->describe() + ")");
    log << "resumed " << run_dir << " from " << *latest << " at step " << first_step << "\n";
  }
  // Every rank has passed its checks and read the checkpoint before rank 0 writes anything.
  if (dist) dist->barrier("start-up barrier");
  std::optional<formats::MetricsWriter> metrics;
  if (writer) {
    nlohmann::json config_json = options_to_json(opt, batch, grad_accum, precision, *opt.steps);
    config_json["world_size"] = world_size;
    config_json["dist_buckets"] = opt.dist_buckets;
    if (opt.reduce_dtype) config_json["reduce_dtype"] = *opt.reduce_dtype;
    if (opt.cuda_graph) config_json["cuda_graph"] = *opt.cuda_graph;
    formats::write_file_atomic(config_path, config_json.dump(2) + "\n");
    if (!opt.recipe_path.empty()) formats::write_recipe(recipe, join_path(run_dir, "recipe.json"));
    metrics.emplace(resuming ? formats::MetricsWriter::resume(join_path(run_dir, "metrics.jsonl"), first_step - 1)
                             : formats::MetricsWriter::create(join_path(run_dir, "metrics.jsonl")));
  }

  const int64_t total_steps = *opt.steps;
  const int64_t samples_per_step = batch * grad_accum * world_size;  // the global batch
  log << "vlatune train: " << opt.config << " Pi0.5 on " << device << ", " << source->describe() << ", batch " << batch
      << " x " << grad_accum;
  if (dist) log << " x " << world_size << " processes";
  log << ", precision " << precision << ", steps " << first_step << ".." << total_steps << ", recompute "
      << applied.recompute.size() << " module(s), fp8 " << applied.fp8.size() << " Linear(s), run dir " << run_dir
      << "\n";
  if (dist) {
    const auto& groups = parts.buckets->groups();
    int64_t bytes = 0, dense_bytes = 0;
    for (const auto& g : groups) bytes += g.bytes, dense_bytes += g.dense_bytes;
    log << "data-parallel: " << world_size << " processes (" << dist->env().launcher << ", " << dist->backend_name()
        << "), gradients in " << groups.size() << " bucket(s) of "
        << (opt.reduce_dtype.value_or(applied.reduce_dtype) == "fp32" ? "fp32" : "bf16") << " (" << std::fixed
        << std::setprecision(1) << bytes / 1048576.0 << " MiB all-reduced of " << dense_bytes / 1048576.0
        << std::defaultfloat << " MiB), "
        << (opt.dist_buckets == "one" ? "one all-reduce after backward" : "all-reduced per group during backward")
        << "\n";
  }

  auto write_ck = [&](int64_t next_step) -> std::string {
    if (!writer) return {};  // rank 0 alone writes checkpoints (every rank holds the same state)
    CheckpointContents ck;
    ck.next_step = next_step;
    ck.optimizer = optimizer.state_dict();
    if (ema) ck.ema = ema->state();
    ck.trainer_state = {{"skipped_steps", skipped_total},
                        {"data_fingerprint", source->position().fingerprint},
                        {"seed", opt.seed},
                        {"lr_next", schedule.lr(next_step)}};
    return write_checkpoint(run_dir, *net, ck, opt.keep_last);
  };

  // ---- 6. The step loop. ----
  SignalScope signals;
  const bool bar = writer && opt.progress_bar.value_or(::isatty(STDERR_FILENO) == 1);
  int64_t consecutive_nonfinite = 0;
  double peak_gib = 0.0;
  int64_t step = first_step;
  bool stop = !dist && g_stop_signal.load() != 0;  // data-parallel: the ranks agree after each step
  const auto loop_start = std::chrono::steady_clock::now();
  std::optional<StepWatchdog> watchdog;
  if (dist)
    watchdog.emplace(rank, world_size, std::chrono::milliseconds(static_cast<int64_t>(opt.dist_timeout_s * 1000.0)));
  for (; step < total_steps && !stop; ++step) {
    reset_peak_allocated(device);
    const auto t0 = std::chrono::steady_clock::now();
    const double lr = schedule.lr(step);
    StepOutcome outcome;
    try {
      outcome = run_train_step(parts, step, lr, opt.clip_norm);
    } catch (const c10::OutOfMemoryError& e) {
      if (step == first_step)
        throw std::runtime_error(out_of_memory_message("in the first step", batch, grad_accum, opt.max_memory_gib,
                                                       recipe, recipe_label, e.what_without_backtrace()));
      throw;
    }
    const StepResult& res = outcome.optimizer;
    const double wait_ms = outcome.wait_ms;
    if (!res.skipped && ema) ema->update();
    if (cuda) torch::cuda::synchronize();
    const double step_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    double loss = outcome.loss;
    if (dist) {
      // The mean loss over ranks (what one process would log) and whether any rank was asked to stop, in one
      // all-reduce, so that every rank leaves the loop after the same step.
      torch::Tensor t = torch::tensor({loss, g_stop_signal.load() != 0 ? 1.0 : 0.0}, torch::kFloat64).to(device);
      dist->allreduce_sum_blocking(t, "all-reduce of the step's loss");
      t = t.cpu();
      loss = t[0].item<double>() / world_size;
      stop = t[1].item<double>() > 0;
    } else {
      stop = g_stop_signal.load() != 0;
    }
    if (watchdog) watchdog->step_done();
    const bool nonfinite = res.skipped || !std::isfinite(loss);
    // A replayed graph allocates nothing: its peak is the capture's.
    const double step_peak = std::max(peak_allocated_gib(device), outcome.graph_peak_gib);
    peak_gib = std::max(peak_gib, step_peak);
    const double samples_per_s = samples_per_step / (step_ms / 1e3);

    formats::MetricsRow row;
    row.step = step;
    row.loss = loss;
    row.grad_norm = res.grad_norm;
    row.lr = lr;
    row.samples_per_s = samples_per_s;
    row.step_ms = step_ms;
    row.data_wait_ms = wait_ms;
    row.peak_gib = step_peak;
    row.skipped = nonfinite;
    if (metrics) metrics->append(row);
    if (step - first_step >= opt.timing_warmup) {
      timing_step_ms.push_back(step_ms);
      timing_loss.push_back(loss);
      timing_grad_norm.push_back(res.grad_norm);
    }

    // Guards: a non-finite loss or gradient norm skips the update (the optimizer wrote nothing).
    if (nonfinite) {
      ++skipped_total;
      ++consecutive_nonfinite;
      log << "step " << step << ": non-finite " << (std::isfinite(loss) ? "gradient norm" : "loss")
          << ", update skipped (" << consecutive_nonfinite << " in a row)\n";
      if (consecutive_nonfinite >= opt.max_consecutive_nonfinite)
        throw std::runtime_error("stopping: " + std::to_string(consecutive_nonfinite) +
                                 " consecutive steps with a non-finite loss or gradient norm (last at step " +
                                 std::to_string(step) + "); lower --lr or check the data's normalization");
    } else {
      consecutive_nonfinite = 0;
    }

    // Progress: a bar with rate and ETA on a terminal, one plain line per log_every steps otherwise.
    const double elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - loop_start).count();
    const double eta_s =
        elapsed_s / static_cast<double>(step - first_step + 1) * static_cast<double>(total_steps - step - 1);
    if (bar) {
      const int width = 30;
      const int filled = static_cast<int>(width * (step + 1) / total_steps);
      std::ostringstream os;
      os << "\r[" << std::string(filled, '#') << std::string(width - filled, '.') << "] " << step + 1 << "/"
         << total_steps << " loss " << std::setprecision(4) << loss << " " << std::fixed << std::setprecision(1)
         << samples_per_s << " samples/s ETA " << format_duration(eta_s) << "   ";
      std::cerr << os.str() << std::flush;
    } else if (opt.log_every > 0 && (step % opt.log_every == 0 || step + 1 == total_steps)) {
      log << "step " << step + 1 << "/" << total_steps << " | loss " << std::setprecision(6) << loss << " | gnorm "
          << std::setprecision(4) << res.grad_norm << " | lr " << std::scientific << std::setprecision(2) << lr
          << std::defaultfloat << " | " << std::fixed << std::setprecision(1) << step_ms << " ms | " << samples_per_s
          << " samples/s | wait " << wait_ms << " ms";
      if (cuda) log << " | peak " << std::setprecision(2) << step_peak << " GiB";
      log << " | ETA " << format_duration(eta_s) << std::defaultfloat << "\n";
    }

    if (opt.save && opt.checkpoint_every > 0 && (step + 1) % opt.checkpoint_every == 0 && step + 1 < total_steps)
      write_ck(step + 1);
  }
  if (bar) std::cerr << "\n";

  // ---- 7. End of run: checkpoint, final weights (EMA when on), norm stats, run.json. ----
  TrainSummary summary;
  summary.run_dir = run_dir;
  summary.first_step = first_step;
  summary.last_step = step;
  summary.skipped_steps = skipped_total;
  summary.interrupted = stop;
  summary.rank = rank;
  summary.world_size = world_size;
  summary.peak_gib = peak_gib;
  if (dist) {
    parts.buckets->check_row_bounds();  // the last step's row-sparse gradients fitted their capacity
    // Every rank applied the same averaged gradients to the same weights: check that they still agree (a sum and
    // an absolute sum of all parameters per rank, gathered in one all-reduce), once, at the end.
    torch::NoGradGuard no_grad;
    torch::Tensor slots = torch::zeros({2 * world_size}, torch::TensorOptions().dtype(torch::kFloat64).device(device));
    for (const auto& item : named_params) {
      torch::Tensor d = item.second.detach().to(torch::kFloat64);
      slots[2 * rank] += d.sum();
      slots[2 * rank + 1] += d.abs().sum();
    }
    dist->allreduce_sum_blocking(slots, "all-reduce of the parameter checksums");
    slots = slots.cpu();
    const double* c = slots.data_ptr<double>();
    for (int r = 1; r < world_size; ++r) {
      if (c[2 * r] != c[0] || c[2 * r + 1] != c[1]) {
        std::ostringstream os;
        os << std::setprecision(17) << "distributed: the parameters differ across ranks after step " << step
           << ": rank 0 checksum " << c[0] << " / " << c[1] << ", rank " << r << " " << c[2 * r] << " / "
           << c[2 * r + 1];
        throw DistributedError(os.str());
      }
    }
    log << "data-parallel: parameters identical on all " << world_size << " ranks (checksum " << std::setprecision(17)
        << c[0] << std::defaultfloat << std::setprecision(6) << ")\n";
  }
  watchdog.reset();  // past the last collective: the writes below may take longer than a step
  if (opt.save) {
    const std::string ck_dir = write_ck(step);
    if (summary.interrupted)
      log << "interrupted by a signal after step " << step << "; checkpoint " << ck_dir
          << "; continue with: vlatune train --resume " << run_dir << "\n";
  } else if (summary.interrupted) {
    log << "interrupted by a signal after step " << step << " (--no-save: no checkpoint to resume from)\n";
  }

  if (!writer) return summary;  // the rest is rank 0's: final weights, norm stats, run.json

  const std::string final_dir = join_path(run_dir, "final");
  make_directories(final_dir);
  if (!opt.save) {
    // Benchmark run: the weights are not needed (a full Pi0.5 checkpoint is ~20 GB of disk writes).
  } else if (ema) {
    // The EMA weights are what openpi saves for inference: swap them in, save, swap back.
    std::vector<std::pair<std::string, torch::Tensor>> live;
    for (const auto& [name, t] : named_params) live.emplace_back(name, t.detach().clone());
    ema->apply_to_params();
    model::save_state_dict(*net, join_path(final_dir, "model.safetensors"), {{"format", "pt"}, {"weights", "ema"}});
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < live.size(); ++i) named_params[i].second.copy_(live[i].second);
  } else {
    model::save_state_dict(*net, join_path(final_dir, "model.safetensors"), {{"format", "pt"}, {"weights", "last"}});
  }
  if (opt.data != "synthetic") {
    // The manifest alone: Dataset::open would hash every shard again (tens of GiB for a LeRobot import).
    const NormStats norm = read_manifest(join_path(opt.data, "manifest.json")).norm;
    formats::write_file_atomic(join_path(final_dir, "norm_stats.json"), norm_stats_file_json(norm).dump(2) + "\n");
  }

  formats::RunRecord run;
  run.schema = formats::kRunSchema;
  run.steps = step;
  run.warmup_steps = std::min<int64_t>(opt.timing_warmup, step - first_step);
  run.skipped_steps = skipped_total;
  run.batch = samples_per_step;
  run.seed = static_cast<int64_t>(opt.seed);
  run.data = opt.data;
  run.step_ms = timing_step_ms;
  run.loss = timing_loss;
  run.grad_norm = timing_grad_norm;
  if (!timing_step_ms.empty()) {
    summary.samples_per_s_median = samples_per_step / (median(timing_step_ms) / 1e3);
    run.samples_per_s_median = summary.samples_per_s_median;
  }
  if (cuda) run.peak_gib = peak_gib;
  run.environment = capture_environment(device, opt.config, formats::recipe_hash(recipe), world_size);
  formats::write_run_record(run, join_path(run_dir, "run.json"));
  if (const std::string tuning = kernels::gemm_tuning_summary(); !tuning.empty()) log << tuning << "\n";
  log << kernels::cudnn_sdpa_tuning_summary();
  log << "done: steps " << first_step << ".." << step << ", median ";
  if (timing_step_ms.empty())
    log << "n/a (no step after the " << opt.timing_warmup << " timing warm-up steps)";
  else
    log << std::fixed << std::setprecision(2) << summary.samples_per_s_median << " samples/s" << std::defaultfloat
        << (dist ? " (global: all " + std::to_string(world_size) + " processes)" : std::string());
  if (cuda) log << ", peak " << std::fixed << std::setprecision(2) << peak_gib << " GiB" << std::defaultfloat;
  log << ", skipped " << skipped_total << "; " << join_path(run_dir, "run.json") << "\n";
  if (parts.step_graph) {
    const StepGraph::Stats& g = parts.step_graph->stats();
    log << "cuda graph: " << g.replays << " step(s) replayed, " << g.eager_steps << " eager, " << g.captures
        << " capture(s)" << (g.disabled.empty() ? std::string() : "; capture given up: " + g.disabled) << "\n";
  }
  // A planned recipe carries the tuner's prediction: say how close it came (the plan's validation, goal 10%);
  // only for the batch it was made for (--batch/--grad-accum may override it).
  auto versus = [&log](const char* what, double predicted, double measured, const char* unit) {
    log << what << " predicted " << std::fixed << std::setprecision(2) << predicted << " " << unit << " vs measured "
        << measured << " " << unit << " (" << std::showpos << std::setprecision(1)
        << 100.0 * (predicted / measured - 1.0) << std::noshowpos << "%)" << std::defaultfloat;
  };
  const formats::Recipe::Predicted& predicted = recipe.predicted;
  const bool as_planned = samples_per_step == int64_t{recipe.batch.micro_batch} * recipe.batch.grad_accum;
  if (predicted.step_ms && !timing_step_ms.empty() && as_planned) {
    versus("plan: step", *predicted.step_ms, median(timing_step_ms), "ms");
    if (predicted.peak_gib && cuda && peak_gib > 0) versus(", peak", *predicted.peak_gib, peak_gib, "GiB");
    log << "\n";
  }
  return summary;
}

}  // namespace vlatune::trainer
