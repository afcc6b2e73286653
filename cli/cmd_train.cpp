// `vlatune train`: the built-in Pi0.5 trainer, configured by a recipe (flags override its keys).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <iostream>
#include <memory>

#include "cli/cli.h"
#include "cli/validators.h"
#include "formats/json_error.h"
#include "trainer/train_loop.h"

namespace vlatune::cli {

namespace {

// What `--resume` may be given with: the run length and bookkeeping. Everything else is the run's own (its
// train_config.json and recipe.json) and cannot change on resume.
const char* const kResumeFlags[] = {"--resume",       "--steps",      "--timing-warmup", "--checkpoint-every",
                                    "--keep-last",    "--workers",    "--log-every",     "--no-progress",
                                    "--dist-timeout", "--max-memory", "--help"};

struct TrainCliOptions {
  trainer::TrainOptions train;
  int64_t batch = 0, grad_accum = 0, steps = 0, timing_warmup = 0, checkpoint_every = 0;
  int keep_last = 0, workers = 0;
  std::string precision, reduce_dtype, cuda_graph;
  double decay_lr = 0, max_memory_gib = 0;
  bool no_progress = false;
  bool no_save = false;
  bool no_tensorboard = false;
  bool no_step_overlap = false;
};

// The flags given with --resume that it cannot take, refused all at once.
void refuse_fixed_flags_on_resume(CLI::App& cmd) {
  std::string fixed;
  for (const CLI::Option* option : cmd.get_options()) {
    if (option->count() == 0) continue;
    const std::string name = option->get_name();
    if (std::find(std::begin(kResumeFlags), std::end(kResumeFlags), name) != std::end(kResumeFlags)) continue;
    fixed += (fixed.empty() ? "" : ", ") + name;
  }
  if (!fixed.empty())
    throw BadInput(
        "--resume continues a run with its own settings (RUNDIR/train_config.json and recipe.json): " + fixed +
        " cannot change; only --steps (to extend the run), --timing-warmup, --checkpoint-every, "
        "--keep-last, --workers, --log-every, --no-progress, --dist-timeout and --max-memory may be given");
}

int run_train(TrainCliOptions& o, CLI::App& cmd, Context& ctx) {
  trainer::TrainOptions t = o.train;
  if (!t.resume.empty()) refuse_fixed_flags_on_resume(cmd);
  if (cmd.count("--batch")) t.batch = o.batch;
  if (cmd.count("--grad-accum")) t.grad_accum = o.grad_accum;
  if (cmd.count("--steps")) t.steps = o.steps;
  if (cmd.count("--precision")) t.precision = o.precision;
  if (cmd.count("--reduce-dtype")) t.reduce_dtype = o.reduce_dtype;
  if (cmd.count("--cuda-graph")) t.cuda_graph = o.cuda_graph;
  if (cmd.count("--decay-lr")) t.decay_lr = o.decay_lr;
  if (cmd.count("--max-memory")) t.max_memory_gib = o.max_memory_gib;
  if (cmd.count("--timing-warmup")) t.timing_warmup = o.timing_warmup;
  if (cmd.count("--checkpoint-every")) t.checkpoint_every = o.checkpoint_every;
  if (cmd.count("--keep-last")) t.keep_last = o.keep_last;
  if (cmd.count("--workers")) t.workers = o.workers;
  if (o.no_progress) t.progress_bar = false;
  if (o.no_save) t.save = false;
  if (o.no_tensorboard) t.tensorboard = false;
  if (o.no_step_overlap) t.overlap_steps = false;
  try {
    auto summary = trainer::run_training(t, ctx.out);
    return summary.interrupted ? 130 : kExitOk;
  } catch (const trainer::TrainInputError& e) {
    throw BadInput(e.what());
  } catch (const formats::FormatError& e) {
    throw BadInput(e.what());
  }  // trainer::DistributedError (a rank died, rendezvous failed): a plain failure, exit 1, naming the operation
}

}  // namespace

void setup_train(CLI::App& app, Context& ctx) {
  auto o = std::make_shared<TrainCliOptions>();
  auto* cmd = app.add_subcommand("train",
                                 "Train Pi0.5 with a recipe -> RUNDIR/{train_config.json, recipe.json, metrics.jsonl, "
                                 "run.json, checkpoints/, final/}");
  cmd->option_defaults()->always_capture_default();  // --help shows the default of every flag
  auto& t = o->train;
  cmd->add_option("--config", t.config, "Model size")
      ->check(CLI::IsMember({"tiny", "full"}))
      ->default_str("full on a GPU, tiny on the CPU");
  cmd->add_option("--data", t.data,
                  "Dataset directory (vlatune data synth|import), or 'synthetic' (batches generated on the device). "
                  "The action horizon is the dataset's chunk length: data synth/import --horizon, default 50 "
                  "(openpi's Pi0.5 default and pi05_base's; openpi's pi05_libero fine-tunes on 10)")
      ->default_str("required");
  cmd->add_option("--steps", o->steps, "Total optimizer steps (on --resume: extend the run to this many)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40))
      ->default_str("required; on --resume the run's");
  cmd->add_option("--batch", o->batch, "Micro-batch size per process (recipe: batch.micro_batch)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->default_str("the recipe's, 32");
  cmd->add_option("--grad-accum", o->grad_accum, "Micro-batches per optimizer step (recipe: batch.grad_accum)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->default_str("the recipe's, 1");
  cmd->add_option("--out", t.out, "Run directory of a new run: new, or empty")->default_str("");
  cmd->add_option("--recipe", t.recipe_path, "recipe.json (flags override its keys; the run keeps its own copy)")
      ->check(regular_file())
      ->default_str("the default recipe (recipes/README.md)");
  cmd->add_option("--resume", t.resume,
                  "Continue the run in RUNDIR from its newest checkpoint (from step 0 when it has none) with its own "
                  "settings")
      ->check(CLI::ExistingDirectory)
      ->default_str("");
  cmd->add_option("--init-weights", t.init_weights, "openpi/LeRobot-named safetensors to start from")
      ->check(regular_file())
      ->default_str("none: initialized from --seed");
  cmd->add_option("--device", t.device, "auto: the GPU when visible")->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  cmd->add_option("--max-memory", o->max_memory_gib,
                  "GiB: cap the CUDA caching allocator (rehearse a smaller GPU's plan; an over-budget run fails "
                  "with the recipe's predicted peak). No effect on the CPU")
      ->check(finite_range(0.001, 1e6))
      ->default_str("none: the whole GPU");
  cmd->add_option("--precision", o->precision, "bf16 (parameters and AdamW state in bf16) or fp32-master")
      ->check(CLI::IsMember({"bf16", "fp32-master"}))
      ->default_str("the recipe's, bf16");
  cmd->add_option("--lr", t.lr, "Peak learning rate (openpi pi05_libero)")->check(finite_range(0.0, 1.0));
  cmd->add_option("--warmup-steps", t.warmup_steps, "Linear warmup steps")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  cmd->add_option("--decay-steps", t.decay_steps, "Cosine decay ends at this step")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  cmd->add_option("--decay-lr", o->decay_lr, "Learning rate at the end of the cosine")
      ->check(finite_range(0.0, 1.0))
      ->default_str("= --lr");
  cmd->add_option("--clip-norm", t.clip_norm, "Global gradient-norm clip (0: off)")->check(finite_range(0.0, 1e9));
  cmd->add_option("--weight-decay", t.weight_decay, "AdamW weight decay")->check(finite_range(0.0, 1.0));
  cmd->add_option("--ema", t.ema_decay, "EMA decay of the weights (0: off; openpi pi05_libero: 0.999)")
      ->check(finite_range(0.0, 0.999999));
  cmd->add_option("--action-dim", t.loss_action_dim, "Loss over the first N action dims (LeRobot: the real ones)")
      ->check(CLI::Range(int64_t{1}, int64_t{32}));
  cmd->add_option("--seed", t.seed, "Seed of initialization, data order and flow-matching draws")
      ->check(unsigned_integer());
  cmd->add_option("--checkpoint-every", o->checkpoint_every, "Steps between checkpoints (0: only the last)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40))
      ->default_str(std::to_string(trainer::kDefaultCheckpointEvery));
  cmd->add_option("--keep-last", o->keep_last, "Checkpoints kept")
      ->check(CLI::Range(1, 1000))
      ->default_str(std::to_string(trainer::kDefaultKeepLast));
  cmd->add_flag("--no-save", o->no_save,
                "Write no checkpoint and no final weights (benchmark runs): run.json and metrics.jsonl only");
  cmd->add_option("--timing-warmup", o->timing_warmup,
                  "Steps left out of run.json's per-step series (time, loss, grad norm)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20))
      ->default_str(std::to_string(trainer::kDefaultTimingWarmup));
  cmd->add_option("--workers", o->workers, "Data loader threads")
      ->check(CLI::Range(1, 256))
      ->default_str(std::to_string(trainer::kDefaultWorkers));
  cmd->add_flag("--augment", t.augment, "openpi training augmentation (crop, rotation, color jitter)");
  cmd->add_option("--log-every", t.log_every, "Plain log line every N steps")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  cmd->add_flag("--no-progress", o->no_progress, "Plain log lines even on a terminal");
  cmd->add_flag("--no-tensorboard", o->no_tensorboard,
                "Write no TensorBoard event file (by default events.out.tfevents.* beside metrics.jsonl holds "
                "the same scalars: tensorboard --logdir RUN_DIR)");
  cmd->add_flag("--no-step-overlap", o->no_step_overlap,
                "Read each step's loss and gradient norm before queuing the next (by default the next step is "
                "queued first, so the GPU does not wait for the host between steps; the results are the same)");
  cmd->add_option("--eval-data", t.eval_data,
                  "Held-out packed dataset (data import --val-episodes: OUT/val): evaluation rows in metrics.jsonl, "
                  "as vlatune eval computes them")
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--eval-every", t.eval_every, "Evaluate after every N steps (0: after the last step only)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  cmd->add_option("--eval-batches", t.eval_batches, "Batches per evaluation (0: the whole held-out set)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  cmd->add_option("--cuda-graph", o->cuda_graph,
                  "step: replay each step as one captured CUDA graph (CUDA, one process, grad_accum 1; recipe: "
                  "model_options.cuda_graph); off: eager")
      ->check(CLI::IsMember({"off", "step"}))
      ->default_str("the recipe's, off");
  // Data-parallel (under `vlatune launch --nproc N`, torchrun or Slurm; --batch/--grad-accum are per process).
  cmd->add_option("--reduce-dtype", o->reduce_dtype, "Gradient all-reduce dtype (recipe: distributed.reduce_dtype)")
      ->check(CLI::IsMember({"bf16", "fp32"}))
      ->default_str("the recipe's, bf16");
  cmd->add_option("--dist-buckets", t.dist_buckets,
                  "groups: all-reduce each recipe group as its backward ends; one: one bucket after backward (the "
                  "comparison baseline)")
      ->check(CLI::IsMember({"groups", "one"}));
  cmd->add_option("--dist-timeout", t.dist_timeout_s,
                  "Seconds a collective or the rendezvous may take before the run fails")
      ->check(finite_range(0.1, 86400.0));
  cmd->callback([&ctx, o, cmd] { ctx.action = [&ctx, o, cmd] { return run_train(*o, *cmd, ctx); }; });
}

}  // namespace vlatune::cli
