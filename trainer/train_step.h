// One training step and what it needs, shared by `vlatune train` (run_training) and `vlatune profile` (whose
// session drives run_train_step through the profiler's step callback, so the profiler times exactly the step
// the trainer runs).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include <c10/core/Event.h>
#include <torch/torch.h>

#include "formats/recipe.h"
#include "model/pi05.h"
#include "trainer/data_source.h"
#include "trainer/distributed.h"
#include "trainer/grad_buckets.h"
#include "trainer/optimizer.h"
#include "trainer/recipe_apply.h"
#include "trainer/train_loop.h"

namespace vlatune::trainer {

class StepGraph;

struct TrainingParts {
  std::string config_name;  // "tiny" | "full"
  model::Pi05Config config;
  torch::Device device{torch::kCPU};
  int64_t batch = 1, grad_accum = 1;
  std::string precision;  // "bf16" | "fp32-master"
  model::Pi05 net{nullptr};
  AppliedRecipe applied;  // applied.effective: the recipe the run records
  std::unique_ptr<DataSource> source;
  std::vector<std::pair<std::string, torch::Tensor>> named_params;
  std::unique_ptr<AdamW> optimizer;
  // Data-parallel (null: one process). Rank r reads micro-batch (step * grad_accum + micro) * world + r, so the
  // world's micro-batches of a step are those one process would read with grad_accum x world.
  std::shared_ptr<ProcessGroup> dist;
  std::unique_ptr<GradBuckets> buckets;
  // Set: steps replay a captured CUDA graph (trainer/step_graph.h); null: eager.
  std::shared_ptr<StepGraph> step_graph;
};

// The process's place in a data-parallel job, from the launch environment (trainer/distributed.h); nullopt for
// one process. Malformed variables: TrainInputError.
std::optional<DistEnv> job_environment();

// Joins the job: the process bound to its device (cuda:LOCAL_RANK), NCCL's environment prepared (a warning line
// on `log` when the user's own setting is kept), then the rendezvous and the process group under `timeout_s`.
// `vlatune train` and `vlatune profile` both join through this. Bad options: TrainInputError.
std::shared_ptr<ProcessGroup> join_job(const DistEnv& env, const std::string& device_choice, double timeout_s,
                                       std::ostream& log);

// The model size: `choice` ("tiny" | "full"), or when empty the default for the device: full on a GPU, tiny on the
// CPU (said on `log`).
std::string resolve_model_config(const std::string& choice, torch::Device device, std::ostream& log);

// Model (initialized from opt.seed, then --init-weights when `load_init_weights`), recipe applied with the
// options' overrides (recipe_apply.h), data opened, optimizer created, as `vlatune train` sets them up. Bad
// options: TrainInputError naming the option. With `dist` (more than one process): the device is
// cuda:LOCAL_RANK on CUDA, the recipe's groups and distributed keys are applied, parameters are broadcast from
// rank 0, and gradient buckets are set up.
TrainingParts build_training_parts(const TrainOptions& opt, const formats::Recipe& recipe,
                                   const std::string& recipe_label, bool load_init_weights, std::ostream& log,
                                   std::shared_ptr<ProcessGroup> dist = nullptr);

// FP8 Linears need compute capability 8.9 (kernels/device_probe.h): on an older GPU (`device`: --device) the
// recipe's fp8.modules are cleared, fp8.saved_geglu_inputs goes back to bf16 (it needs an FP8 down projection) and
// fp8.gemm_algorithm to heuristic, so the run trains in bf16 and records that recipe (recipe_hash), with one notice
// in `log`. CPU runs and FP8-capable GPUs keep the recipe.
void drop_fp8_without_hardware(formats::Recipe& recipe, const std::string& device, std::ostream& log);
// Its decision for a GPU of `compute_capability` (e.g. 80), without asking a device.
void drop_fp8_for_capability(formats::Recipe& recipe, int compute_capability, std::ostream& log);

// The data index of micro-batch `micro` of `step` on this rank (see TrainingParts::dist).
int64_t micro_batch_index(const TrainingParts& parts, int64_t step, int64_t micro);

// Re-opens the data source at micro-batch `batch` (the profiler's second batch size).
void open_training_data(TrainingParts& parts, const TrainOptions& opt, int64_t batch);

struct StepOutcome {
  double loss = 0;     // mean over the micro-batches
  double wait_ms = 0;  // data wait
  StepResult optimizer;
  double graph_peak_gib = 0.0;  // a replayed CUDA graph's peak (its allocations happened at capture), else 0
};

// grad_accum x (batch -> forward -> backward), missing gradients zero-filled, gradients all-reduced (averaged)
// when distributed (buckets launched during the last backward, waited before clipping), clip + AdamW at `lr`,
// gradients cleared; `loss` is this rank's. Opens the pseudo-module scopes "<data>" and "<optimizer>".
// Synchronizes once, after the optimizer step is queued (its gradient norm, then the loss, are read): the GPU does
// not sit idle between backward and the optimizer while the host queues it.
// = finish_train_step(queue_train_step(...)), or the captured graph's step (StepGraph::run).
StepOutcome run_train_step(TrainingParts& parts, int64_t step, double lr, double clip_norm);

// An eager step queued on the device whose results the host has not read: its loss and gradient norm are copied
// to host memory behind the update, and `done` is recorded after that copy, so reading them waits for this step's
// work alone, not for work queued after it (the next step). run_training queues step n + 1 before it reads step
// n, so the GPU never waits for the host between steps.
struct QueuedStep {
  int64_t step = 0;
  double lr = 0.0, clip_norm = 0.0;
  double wait_ms = 0.0;  // data wait
  torch::Tensor norm;    // on the device: the gradient norm (not finite: the update was skipped there)
  torch::Tensor host;    // {loss sum over the micro-batches, norm} in fp64 (pinned on CUDA), valid after `done`
  std::optional<c10::Event> done;  // CUDA only
};

// Queues step `step` without a host sync: grad_accum x (batch -> forward -> backward), the optimizer step, the
// copy of the results. `in_flight`: the step queued before this one whose results are not read yet (the optimizer
// then derives this update's bias corrections on the device: AdamW::queue_update). Eager steps only (no StepGraph).
QueuedStep queue_train_step(TrainingParts& parts, int64_t step, double lr, double clip_norm,
                            const QueuedStep* in_flight = nullptr);
// Waits for `q`'s work, reads its loss and norm and closes the optimizer step (AdamW::finish_update). Steps are
// finished in the order they were queued.
StepOutcome finish_train_step(TrainingParts& parts, QueuedStep& q);

// Steps [first, first + n) run as run_training runs them (each queued before the previous one is read), at a fixed
// `lr`: each step's time, from a CUDA event before its first work to its `done` event (the host clock around its
// queueing on the CPU, where the work runs as it is queued), and its data wait. What `vlatune profile` times, so the
// planner predicts the step the trainer runs. Eager, one process (std::logic_error otherwise).
struct TimedStep {
  double ms = 0.0, wait_ms = 0.0;
};
std::vector<TimedStep> run_timed_steps(TrainingParts& parts, int64_t first, int64_t n, double lr, double clip_norm);

// The pieces of a step, shared with StepGraph:
// the batch of micro-batch `micro` of `step` (in the "<data>" scope);
model::Pi05Batch next_batch(TrainingParts& parts, int64_t step, int64_t micro, double* wait_ms);
// forward under `options`, backward of loss / loss_divisor; returns the detached loss in fp64 (on the device);
torch::Tensor forward_backward(TrainingParts& parts, const model::Pi05Batch& batch,
                               const model::ForwardOptions& options, int64_t loss_divisor);
// in the "<optimizer>" scope: missing gradients zero-filled, buckets finished, clip + AdamW queued (with
// `device_schedule`: scalars from AdamW::write_device_schedule), a sharded optimizer's parameters all-gathered,
// gradients cleared; returns the norm on the device for AdamW::finish_update (`in_flight_norm`: see
// AdamW::queue_update).
torch::Tensor queue_optimizer_step(TrainingParts& parts, double lr, double clip_norm, bool device_schedule,
                                   const torch::Tensor& in_flight_norm = {});

// The optimizer's whole state, for a checkpoint: a sharded optimizer's gathered from every rank (a collective:
// every rank calls it), so a checkpoint holds the same tensors sharded or not and resumes on any world size.
OptimizerState optimizer_state(TrainingParts& parts);

}  // namespace vlatune::trainer
