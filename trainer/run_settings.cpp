#include "trainer/run_settings.h"

#include <stdexcept>

#include "formats/checkpoint_state.h"
#include "formats/json_error.h"
#include "trainer/file_util.h"
#include "trainer/run_dir.h"
#include "trainer/schedule.h"

namespace vlatune::trainer {

namespace {

// A new run's settings from the caller's options (unset bookkeeping values: their defaults).
void settings_of_new_run(RunSettings& run, const TrainOptions& o, int world_size) {
  if (o.out.empty()) throw TrainInputError("--out RUNDIR is required (or --resume RUNDIR)");
  if (o.data.empty())
    throw TrainInputError(
        "--data is required: a dataset directory (vlatune data synth|import), or --data synthetic for batches "
        "generated on the device");
  if (!o.steps || *o.steps < 1) throw TrainInputError("--steps N (>= 1) is required for a new run");
  run.run_dir = o.out;
  check_new_run_dir(run.run_dir);  // again under the lock (open_run_dir), this one before any work
  formats::TrainConfig& c = run.config;
  c.run_id = new_run_id();
  c.config = o.config;  // resolved against the device when the model is built
  c.data = o.data == "synthetic" ? o.data : absolute_path(o.data);
  if (!o.recipe_path.empty()) c.recipe_source = absolute_path(o.recipe_path);
  if (!o.init_weights.empty()) c.init_weights = absolute_path(o.init_weights);
  c.device = o.device;
  c.steps = *o.steps;
  c.lr = o.lr;
  c.warmup_steps = o.warmup_steps;
  c.decay_steps = o.decay_steps;
  c.decay_lr = o.decay_lr.value_or(o.lr);
  c.clip_norm = o.clip_norm;
  c.weight_decay = o.weight_decay;
  c.beta1 = o.beta1;
  c.beta2 = o.beta2;
  c.eps = o.eps;
  c.ema_decay = o.ema_decay;
  c.loss_action_dim = o.loss_action_dim;
  c.seed = o.seed;
  c.timing_warmup = o.timing_warmup.value_or(kDefaultTimingWarmup);
  c.checkpoint_every = o.checkpoint_every.value_or(kDefaultCheckpointEvery);
  c.keep_last = o.keep_last.value_or(kDefaultKeepLast);
  c.max_consecutive_nonfinite = o.max_consecutive_nonfinite;
  c.workers = o.workers.value_or(kDefaultWorkers);
  c.augment = o.augment;
  c.save = o.save;
  c.world_size = world_size;
  c.dist_buckets = o.dist_buckets;
  if (!o.recipe_path.empty()) run.recipe = formats::read_recipe(o.recipe_path);  // FormatError names the path
  run.recipe_label = o.recipe_path.empty() ? std::string("<default recipe>") : o.recipe_path;
}

// A resumed run's settings: its own train_config.json and recipe.json, with the caller's new --steps and
// bookkeeping values; a new world size keeps the global batch (and so the data order, schedule and numerics).
void settings_of_resumed_run(RunSettings& run, const TrainOptions& caller, int world_size, std::ostream& log) {
  run.resuming = true;
  run.run_dir = caller.resume;
  const std::string& dir = run.run_dir;
  const std::string config_path = join_path(dir, "train_config.json");
  if (!path_exists(config_path))
    throw TrainInputError("--resume " + dir + ": no train_config.json there (not a vlatune run directory)");
  run.config = formats::read_train_config(config_path);
  formats::TrainConfig& c = run.config;
  if (!c.save) throw TrainInputError("--resume " + dir + ": the run was made with --no-save: it has no checkpoint");
  const std::string recipe_path = join_path(dir, "recipe.json");
  if (!path_exists(recipe_path))
    throw TrainInputError("--resume " + dir + ": recipe.json is missing, so the run's recipe is unknown");
  run.recipe = formats::read_recipe(recipe_path);
  run.recipe_label = recipe_path;

  // The step to start from: the newest of the run's own checkpoints (refusing anything else under checkpoints/),
  // or 0 when it was stopped before its first one.
  const std::vector<std::string> checkpoints = own_checkpoints(dir, c.run_id);
  int64_t done = 0;
  if (!checkpoints.empty()) {
    run.resume_from = checkpoints.back();
    done = formats::read_checkpoint_state(join_path(checkpoints.back(), "state.json")).next_step;
  }
  if (caller.steps) {
    if (*caller.steps <= done)
      throw TrainInputError("--steps " + std::to_string(*caller.steps) + ": the run " + dir + " is at step " +
                            std::to_string(done) + " already; to continue it, pass --steps above " +
                            std::to_string(done));
    c.steps = *caller.steps;
  } else if (done >= c.steps) {
    throw TrainInputError("--resume " + dir + ": the run is finished (step " + std::to_string(done) + " of " +
                          std::to_string(c.steps) + "); to train it further, pass --steps above " +
                          std::to_string(done));
  }
  if (caller.timing_warmup) c.timing_warmup = *caller.timing_warmup;
  if (caller.checkpoint_every) c.checkpoint_every = *caller.checkpoint_every;
  if (caller.keep_last) c.keep_last = *caller.keep_last;
  if (caller.workers) c.workers = *caller.workers;

  if (c.world_size != world_size) {
    const int64_t micro_batches = run.recipe.batch.grad_accum * c.world_size;
    if (micro_batches % world_size != 0)
      throw TrainInputError("--resume " + dir + ": the run's global batch is " + std::to_string(micro_batches) +
                            " micro-batches of " + std::to_string(run.recipe.batch.micro_batch) + " (grad_accum " +
                            std::to_string(run.recipe.batch.grad_accum) + " x " + std::to_string(c.world_size) +
                            " processes); " + std::to_string(world_size) +
                            " processes cannot share them evenly: resume with a world size that divides " +
                            std::to_string(micro_batches));
    log << "resuming a " << c.world_size << "-process run on " << world_size << ": grad_accum "
        << run.recipe.batch.grad_accum << " -> " << micro_batches / world_size << " (same global batch)\n";
    run.options.grad_accum = micro_batches / world_size;
    c.world_size = world_size;
  }
}

// The options build_training_parts takes, from the run's settings.
void parts_options(RunSettings& run, const TrainOptions& caller) {
  const formats::TrainConfig& c = run.config;
  TrainOptions& o = run.options;
  if (!run.resuming) {  // a resumed run's recipe.json already holds what a new run's flags set
    o.batch = caller.batch;
    o.grad_accum = caller.grad_accum;
    o.precision = caller.precision;
    o.reduce_dtype = caller.reduce_dtype;
    o.cuda_graph = caller.cuda_graph;
  }
  o.progress_bar = caller.progress_bar;
  o.log_every = caller.log_every;
  o.tensorboard = caller.tensorboard;  // an output, not part of what the run computes
  o.config = c.config;
  o.data = c.data == "synthetic" ? c.data : formats::resolve_run_path(run.run_dir, c.data);
  o.init_weights = c.init_weights ? formats::resolve_run_path(run.run_dir, *c.init_weights) : std::string();
  o.device = c.device;
  o.dist_buckets = c.dist_buckets;
  o.dist_timeout_s = caller.dist_timeout_s;
  o.max_memory_gib = caller.max_memory_gib;  // this device's cap, not the run's: the caller's, on resume too
  o.steps = c.steps;
  o.lr = c.lr;
  o.warmup_steps = c.warmup_steps;
  o.decay_steps = c.decay_steps;
  o.decay_lr = c.decay_lr;
  o.clip_norm = c.clip_norm;
  o.weight_decay = c.weight_decay;
  o.beta1 = c.beta1;
  o.beta2 = c.beta2;
  o.eps = c.eps;
  o.ema_decay = c.ema_decay;
  o.loss_action_dim = c.loss_action_dim;
  o.seed = c.seed;
  o.workers = static_cast<int>(c.workers);
  o.augment = c.augment;
}

}  // namespace

RunSettings run_settings(const TrainOptions& caller, int world_size, std::ostream& log) {
  RunSettings run;
  if (caller.resume.empty())
    settings_of_new_run(run, caller, world_size);
  else
    settings_of_resumed_run(run, caller, world_size, log);
  parts_options(run, caller);
  formats::TrainConfig checked = run.config;  // every value in range before any work (the config: once resolved)
  if (checked.config.empty()) checked.config = "tiny";
  formats::parse_train_config(formats::train_config_to_json(checked), "the train options");
  const formats::TrainConfig& c = run.config;
  try {
    WarmupCosine{c.warmup_steps, c.lr, c.decay_steps, c.decay_lr}.validate();
  } catch (const std::invalid_argument& e) {
    throw TrainInputError(e.what());
  }
  return run;
}

}  // namespace vlatune::trainer
