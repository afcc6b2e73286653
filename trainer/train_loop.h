// `vlatune train`: the built-in Pi0.5 trainer. One function, run_training(), that reads top to bottom:
// set up (model, recipe, data, optimizer, resume) -> loop (batch -> forward -> backward -> clip+AdamW -> EMA ->
// metrics -> checkpoint) -> final weights + run.json.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <stdexcept>
#include <string>

namespace vlatune::trainer {

struct TrainOptions {
  std::string config = "tiny";           // model size: tiny | full
  std::string data = "synthetic";        // dataset directory or "synthetic" (generated on the device)
  std::string out;                       // run directory (new run)
  std::string resume;                    // run directory to continue (reads its train_config.json)
  std::string recipe_path;               // recipe.json; flags below override its keys
  std::string init_weights;              // openpi/LeRobot-named safetensors to start from
  std::string device = "auto";           // auto | cpu | cuda
  std::optional<double> max_memory_gib;  // --max-memory: caps the CUDA caching allocator (memory_cap.h)
  // Overridable recipe keys (unset: the recipe's value, else its default).
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
  double clip_norm = 1.0;          // global-norm clipping; <= 0 disables
  double weight_decay = 1e-10;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double ema_decay = 0.0;        // 0: no EMA (openpi pi05_libero uses 0.999)
  int64_t loss_action_dim = 32;  // LeRobot: the robot's real action dims
  uint64_t seed = 42;
  // Bookkeeping.
  int64_t timing_warmup = 3;        // steps (per process) left out of run.json's timing arrays
  int64_t checkpoint_every = 1000;  // 0: only the final checkpoint
  int keep_last = 3;
  bool save = true;  // false (benchmarks): no checkpoints and no final weights, only run.json and metrics.jsonl
  int64_t max_consecutive_nonfinite = 10;
  int workers = 4;  // data loader threads
  bool augment = false;
  std::optional<bool> progress_bar;  // unset: a bar when stderr is a terminal, plain lines otherwise
  int64_t log_every = 1;             // plain log line every N steps
};

struct TrainSummary {
  std::string run_dir;
  int64_t first_step = 0;  // 0 for a new run, the checkpoint's step on resume
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
