// `vlatune train`: the built-in Pi0.5 trainer. run_training() reads top to bottom in three parts (train_loop.cpp):
//   open    who this process is (one process or a rank of a job), the run's settings (a new run's, or the saved
//           ones of the run being resumed), its run directory (locked, checked: trainer/run_dir.h), the job's
//           rendezvous, model + recipe + data + optimizer (train_step.h), where to start (step 0 or the newest
//           checkpoint), the run's outputs;
//   step    batch -> forward -> backward -> clip + AdamW -> EMA, timed; one StepRecord (step_record.h) to every
//           output (metrics.jsonl row, log line); the non-finite guard; a checkpoint when due;
//   finish  the ranks' agreement check, the last checkpoint, final weights (EMA when on), norm stats, run.json.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <stdexcept>
#include <string>

namespace vlatune::trainer {

// A new run takes these; `--resume` takes the run's own (RUNDIR/train_config.json and RUNDIR/recipe.json) and from
// the caller only `steps` and the bookkeeping values that are set (timing_warmup, checkpoint_every, keep_last,
// workers), plus the display ones (progress_bar, log_every), dist_timeout_s and max_memory_gib.
struct TrainOptions {
  std::string config;                    // model size: tiny | full; empty: full on a GPU, tiny on the CPU
  std::string data;                      // dataset directory, or "synthetic" (generated on the device); required
  std::string out;                       // run directory (new run)
  std::string resume;                    // run directory to continue
  std::string recipe_path;               // recipe.json; the overrides below replace its keys
  std::string init_weights;              // openpi/LeRobot-named safetensors to start from
  std::string device = "auto";           // auto | cpu | cuda
  std::optional<double> max_memory_gib;  // --max-memory: caps the CUDA caching allocator (memory_cap.h)
  // Recipe keys set from the command line (unset: the recipe's value, else its default); written into the run's
  // recipe.json, so its recipe_hash is the recipe the run obeyed.
  std::optional<int64_t> batch;             // batch.micro_batch
  std::optional<int64_t> grad_accum;        // batch.grad_accum
  std::optional<std::string> precision;     // model_options.precision: bf16 | fp32-master
  std::optional<std::string> reduce_dtype;  // distributed.reduce_dtype: bf16 | fp32
  std::optional<std::string> cuda_graph;    // model_options.cuda_graph: off | step
  // Data-parallel (launched by torchrun, Slurm or `vlatune launch`; see trainer/distributed.h). --batch and
  // --grad-accum are per process: the global batch is batch x grad_accum x world size.
  std::string dist_buckets = "groups";  // groups: per-group all-reduce during backward | one: one after backward
  double dist_timeout_s = 600;          // a collective (or the rendezvous) not done by then fails the run
  // Run length and optimization (defaults: openpi pi05_libero, spec §9.1).
  std::optional<int64_t> steps;  // total optimizer steps (required for a new run)
  double lr = 5e-5;              // peak learning rate
  int64_t warmup_steps = 10000;
  int64_t decay_steps = 1000000;
  std::optional<double> decay_lr;  // unset: = lr (openpi pi05_libero: constant after warmup)
  double clip_norm = 1.0;          // global-norm clipping; 0 disables
  double weight_decay = 1e-10;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double ema_decay = 0.0;        // 0: no EMA (openpi pi05_libero uses 0.999)
  int64_t loss_action_dim = 32;  // LeRobot: the robot's real action dims
  uint64_t seed = 42;
  // Bookkeeping (unset: the defaults in the comments, or a resumed run's own).
  std::optional<int64_t> timing_warmup;     // 3: steps (per segment) left out of the timing statistics
  std::optional<int64_t> checkpoint_every;  // 1000; 0: only the final checkpoint
  std::optional<int> keep_last;             // 3: checkpoints kept
  std::optional<int> workers;               // 4: data loader threads
  bool save = true;  // false (benchmarks): no checkpoints and no final weights, only run.json and metrics.jsonl
  int64_t max_consecutive_nonfinite = 10;
  bool augment = false;
  std::optional<bool> progress_bar;  // unset: a bar when stderr is a terminal, plain lines otherwise
  int64_t log_every = 1;             // plain log line every N steps
  bool tensorboard = true;           // TensorBoard event file beside metrics.jsonl (trainer/tensorboard_log.h)
  // Queue step n + 1 before reading step n's loss and norm, so the GPU does not wait for the host between steps
  // (run_training says where it does not). Changes nothing a step computes; off (--no-step-overlap): each step is
  // read before the next is queued.
  bool overlap_steps = true;
  // Held-out evaluation (trainer/evaluate.h TrainEvaluation; the caller's, also on --resume: it changes nothing the
  // run computes). Empty eval_data: none; eval_every 0: after the last step only; eval_batches 0: the whole set.
  std::string eval_data;
  int64_t eval_every = 0;
  int64_t eval_batches = 0;
};

inline constexpr int64_t kDefaultTimingWarmup = 3;
inline constexpr int64_t kDefaultCheckpointEvery = 1000;
inline constexpr int kDefaultKeepLast = 3;
inline constexpr int kDefaultWorkers = 4;

struct TrainSummary {
  std::string run_dir;
  int64_t first_step = 0;  // 0 for a new run (or a resumed one without a checkpoint), else the checkpoint's step
  int64_t last_step = 0;   // steps completed
  int64_t skipped_steps = 0;
  double samples_per_s_median = 0.0;
  double peak_gib = 0.0;
  bool interrupted = false;  // SIGINT/SIGTERM: a final checkpoint was written
  int rank = 0, world_size = 1;
};

// Thrown for bad options or inputs (named); the CLI maps it to exit code 4.
class TrainInputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

TrainSummary run_training(const TrainOptions& options, std::ostream& log);

}  // namespace vlatune::trainer
