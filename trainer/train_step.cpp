#include "trainer/train_step.h"

#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "kernels/device_probe.h"
#include "layout/pi05.h"
#include "model/state_dict.h"
#include "profiler/scope.h"
#include "trainer/environment.h"
#include "trainer/memory_cap.h"
#include "trainer/step_graph.h"

namespace vlatune::trainer {

namespace {
// Scopes keep a reference to their name: these outlive every step.
const std::string kDataScopeName = profiler::kDataScope;
const std::string kOptimizerScopeName = profiler::kOptimizerScope;

// Same starting weights everywhere (rank 0's), then one gradient bucket per group.
void setup_data_parallel(TrainingParts& parts, const TrainOptions& opt) {
  {
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> tensors;  // frozen ones too: every rank computes with rank 0's weights
    for (const auto& p : parts.net->parameters()) tensors.push_back(p.detach());
    parts.dist->broadcast(tensors, /*root=*/0, "broadcast of rank 0's initial parameters");
  }
  std::vector<GroupModules> groups;
  if (parts.applied.groups.empty()) {
    groups = default_group_modules(module_fqns(*parts.net));
  } else {
    for (const auto& g : parts.applied.groups) groups.push_back({g.name, g.modules});
    groups = backward_ordered(std::move(groups));
  }
  std::vector<std::string> names;
  for (const auto& item : parts.named_params) names.push_back(item.first);
  GradBucketsOptions options;
  options.reduce_fp32 = parts.applied.reduce_dtype == "fp32";
  options.overlap = opt.dist_buckets == "groups";
  options.shard = parts.applied.shard_optimizer_state;
  // The token embedding's gradient comes from its lookup alone (the LM head is unused): non-zero in at most
  // grad_accum x micro-batch x text length rows per rank.
  for (size_t p = 0; p < names.size(); ++p)
    if (layout::row_sparse_gradient(names[p]))
      options.row_sparse.push_back({p, parts.grad_accum * parts.batch * parts.source->text_len()});
  try {
    parts.buckets =
        std::make_unique<GradBuckets>(parts.dist, parts.named_params, assign_parameters(names, groups), options);
  } catch (const std::invalid_argument& e) {
    throw TrainInputError(std::string("gradient groups: ") + e.what());
  }
}

// The optimizer, over this rank's ranges when its state is sharded (created after the buckets, which lay the
// ranges out, so that no rank ever holds the whole state).
std::unique_ptr<AdamW> make_optimizer(const TrainingParts& parts, const AdamWOptions& adam) {
  if (!parts.applied.shard_optimizer_state) return std::make_unique<AdamW>(parts.named_params, adam);
  GradBuckets* buckets = parts.buckets.get();
  std::shared_ptr<ProcessGroup> pg = parts.dist;
  ShardedGradients gradients;
  gradients.range_gradient = [buckets](size_t i) { return buckets->range_gradient(i); };
  gradients.whole_gradients = buckets->whole_gradients();
  gradients.sum_over_ranks = [pg](torch::Tensor& t) {
    pg->allreduce_sum(t, "all-reduce of the squared gradient norm of the ranks' shards")->wait();
  };
  return std::make_unique<AdamW>(parts.named_params, adam, buckets->ranges(), std::move(gradients));
}

}  // namespace

void drop_fp8_without_hardware(formats::Recipe& recipe, const std::string& device, std::ostream& log) {
  if (recipe.fp8.modules.empty()) return;
  torch::Device d{torch::kCPU};
  try {
    d = resolve_device("--device", device);
  } catch (const std::invalid_argument&) {
    return;  // build_training_parts names the bad flag
  }
  if (!d.is_cuda()) return;
  const int cc = kernels::device_compute_capability(d.has_index() ? d.index() : 0);
  if (cc >= 0) drop_fp8_for_capability(recipe, cc, log);
}

void drop_fp8_for_capability(formats::Recipe& recipe, int compute_capability, std::ostream& log) {
  if (recipe.fp8.modules.empty() || kernels::fp8_supported(compute_capability)) return;
  log << "notice: this GPU (compute capability " << kernels::compute_capability_name(compute_capability)
      << ") has no FP8 GEMMs (" << kernels::compute_capability_name(kernels::kFp8MinComputeCapability)
      << " or newer): the recipe's fp8.modules train in bf16\n";
  recipe.fp8.modules.clear();
  recipe.fp8.saved_geglu_inputs = formats::SavedGegluInputs::kBf16;
  recipe.fp8.gemm_algorithm = formats::Fp8GemmAlgorithm::kHeuristic;
}

std::optional<DistEnv> job_environment() {
  try {
    return dist_env_from_process();
  } catch (const std::invalid_argument& e) {
    throw TrainInputError(std::string("distributed launch environment: ") + e.what());
  }
}

std::shared_ptr<ProcessGroup> join_job(const DistEnv& env, const std::string& device_choice, double timeout_s,
                                       std::ostream& log) {
  if (!(timeout_s > 0) || !std::isfinite(timeout_s)) throw TrainInputError("--dist-timeout must be > 0 seconds");
  torch::Device device{torch::kCPU};
  try {
    device = bind_process_device(resolve_device("--device", device_choice), env);
  } catch (const std::invalid_argument& e) {
    throw TrainInputError(e.what());
  }
  if (device.is_cuda()) {
    const std::string warning = set_nccl_environment();
    if (!warning.empty()) log << "warning: " << warning << "\n";
  }
  return ProcessGroup::create(env, device, std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000.0)));
}

std::string resolve_model_config(const std::string& choice, torch::Device device, std::ostream& log) {
  if (!choice.empty()) return choice;
  const std::string chosen = device.is_cuda() ? "full" : "tiny";
  log << "config: " << chosen << " (the default on " << (device.is_cuda() ? "a GPU" : "the CPU")
      << "; --config tiny|full chooses)\n";
  return chosen;
}

TrainingParts build_training_parts(const TrainOptions& opt, const formats::Recipe& recipe,
                                   const std::string& recipe_label, bool load_init_weights, std::ostream& log,
                                   std::shared_ptr<ProcessGroup> dist) {
  TrainingParts parts;
  parts.dist = std::move(dist);
  try {
    parts.device = resolve_device("--device", opt.device);
  } catch (const std::invalid_argument& e) {
    throw TrainInputError(e.what());
  }
  if (parts.dist && parts.device.is_cuda()) parts.device = torch::Device(torch::kCUDA, parts.dist->env().local_rank);
  apply_memory_cap(parts.device, opt.max_memory_gib, log);  // before the first allocation on the device
  parts.config_name = resolve_model_config(opt.config, parts.device, log);
  try {
    parts.config = model::Pi05Config::named(parts.config_name);
  } catch (const std::invalid_argument& e) {
    throw TrainInputError(std::string("--config: ") + e.what());
  }
  if (opt.dist_buckets != "groups" && opt.dist_buckets != "one")
    throw TrainInputError("--dist-buckets: expected groups or one, got '" + opt.dist_buckets + "'");

  RecipeContext context;
  context.overrides = {opt.batch, opt.grad_accum, opt.precision, opt.reduce_dtype, opt.cuda_graph};
  context.world_size = parts.dist ? parts.dist->size() : 1;
  context.cuda = parts.device.is_cuda();
  context.seed = opt.seed;
  parts.applied = apply_recipe(recipe, recipe_label, context, [&](torch::Dtype parameter_dtype) -> model::Pi05Impl& {
    parts.net = model::Pi05(parts.config, parts.device, parameter_dtype);
    model::init_weights(*parts.net, opt.seed);
    if (!opt.init_weights.empty() && load_init_weights) {
      auto report = model::load_state_dict(*parts.net, opt.init_weights, /*strict=*/false);
      if (!report.missing.empty() || !report.shape_mismatched.empty())
        throw TrainInputError("--init-weights: " + report.summary());
      log << "init weights: " << report.summary() << "\n";
    }
    // The merged GEMMs' members into one buffer per group (read as views, not concatenated each step), now that
    // the parameters are on their device in their dtype; loads (--resume, read_checkpoint) copy into them in place.
    parts.net->pack_merged_weights();
    return *parts.net;
  });
  parts.applied.forward.loss_action_dim = opt.loss_action_dim;
  parts.batch = parts.applied.micro_batch;
  parts.grad_accum = parts.applied.grad_accum;
  parts.precision = parts.applied.precision;

  open_training_data(parts, opt, parts.batch);

  // The trainable parameters (frozen ones, recipe freeze and LoRA's base weights, get no optimizer state).
  int64_t numel_all = 0, numel_trainable = 0;
  for (const auto& item : parts.net->named_parameters()) {
    numel_all += item.value().numel();
    if (!item.value().requires_grad()) continue;
    numel_trainable += item.value().numel();
    parts.named_params.emplace_back(item.key(), item.value());
  }
  if (numel_trainable < numel_all)
    log << "trainable: " << numel_trainable << " of " << numel_all << " parameters ("
        << 100.0 * static_cast<double>(numel_trainable) / static_cast<double>(numel_all) << "%); frozen modules "
        << parts.applied.frozen.size() << ", LoRA adapters " << parts.applied.lora.size() << "\n";
  if (parts.named_params.empty())
    throw TrainInputError(parts.applied.effective.freeze.presets.empty() &&
                                  parts.applied.effective.freeze.modules.empty()
                              ? "nothing to train: every parameter is frozen"
                              : recipe_label + ": $.freeze: every parameter is frozen, nothing to train");
  AdamWOptions adam;
  adam.lr = opt.lr;
  adam.betas = {opt.beta1, opt.beta2};
  adam.eps = opt.eps;
  adam.weight_decay = opt.weight_decay;
  adam.precision = parts.applied.optimizer_precision;
  adam.state_dtype = parts.applied.state_dtype;
  if (parts.dist) setup_data_parallel(parts, opt);
  parts.optimizer = make_optimizer(parts, adam);
  if (adam.state_dtype != OptimizerStateDtype::kAuto || parts.optimizer->sharded()) {
    log << "optimizer state: " << optimizer_state_dtype_name(adam.state_dtype) << ", "
        << static_cast<double>(parts.optimizer->state_bytes()) / 1048576.0 << " MiB";
    if (parts.optimizer->sharded())
      log << " on this rank (" << parts.optimizer->state_bytes() << " bytes; sharded over " << parts.dist->size()
          << " ranks, " << (parts.buckets->whole_gradients() ? "gradients all-reduced" : "gradients reduce-scattered")
          << ")";
    log << "\n";
  }

  if (parts.applied.cuda_graph_step) {
    const std::string why = step_graph_unsupported(parts);
    if (!why.empty()) throw TrainInputError(parts.applied.cuda_graph_source + ": " + why);
    parts.step_graph = std::make_shared<StepGraph>(log);
  }
  return parts;
}

void open_training_data(TrainingParts& parts, const TrainOptions& opt, int64_t batch) {
  LoaderOptions loader;
  loader.workers = opt.workers.value_or(kDefaultWorkers);
  loader.augment = opt.augment;
  if (parts.dist) loader.step_stride = parts.dist->size();  // see micro_batch_index
  if (parts.applied.num_images) loader.slots = *parts.applied.num_images;
  if (opt.data.empty())
    throw TrainInputError(
        "--data is required: a dataset directory (vlatune data synth|import), or --data synthetic for batches "
        "generated on the device");
  parts.source.reset();  // stop the old loader's workers first
  try {
    parts.source = open_data_source(opt.data, parts.config, batch, opt.seed, parts.device, loader);
  } catch (const std::invalid_argument& e) {
    throw TrainInputError(std::string("--data: ") + e.what());
  }
  parts.batch = batch;
}

int64_t micro_batch_index(const TrainingParts& parts, int64_t step, int64_t micro) {
  const int64_t index = step * parts.grad_accum + micro;
  return parts.dist ? index * parts.dist->size() + parts.dist->rank() : index;
}

torch::Tensor forward_backward(TrainingParts& parts, const model::Pi05Batch& batch,
                               const model::ForwardOptions& options, int64_t loss_divisor) {
  auto result = parts.net->forward(batch, options);
  torch::Tensor loss = loss_divisor > 1 ? result.loss / static_cast<double>(loss_divisor) : result.loss;
  loss.backward();
  return result.loss.detach().to(torch::kFloat64);
}

torch::Tensor queue_optimizer_step(TrainingParts& parts, double lr, double clip_norm, bool device_schedule,
                                   const torch::Tensor& in_flight_norm) {
  profiler::Scope optimizer_scope(kOptimizerScopeName, profiler::Phase::kOptimizer);
  // The buckets zero-fill the gradients they reduce themselves (and a reduce-scatter has freed the packed ones).
  if (!parts.buckets) parts.net->fill_missing_grads();
  if (parts.buckets) parts.buckets->finish();  // averaged over ranks before clipping
  torch::Tensor norm = parts.optimizer->queue_update(lr, clip_norm, device_schedule, in_flight_norm);
  if (parts.optimizer->sharded()) parts.buckets->gather_parameters();  // each rank updated its ranges
  parts.optimizer->zero_grad();
  return norm;
}

OptimizerState optimizer_state(TrainingParts& parts) {
  if (!parts.optimizer->sharded()) return parts.optimizer->state_dict();
  std::shared_ptr<ProcessGroup> pg = parts.dist;
  // Each rank's range into zeros, summed over the ranks byte by byte: exact (the ranges are disjoint, so every
  // byte is one rank's value plus zeros) whatever the dtype, also for uint8 codes and -0.0.
  return parts.optimizer->state_dict([pg](const torch::Tensor& range, int64_t start, int64_t numel) {
    torch::Tensor whole = torch::zeros({numel}, range.options());
    whole.narrow(0, start, range.numel()).copy_(range);
    torch::Tensor bytes = whole.view(torch::kUInt8);
    pg->allreduce_sum_blocking(bytes, "all-reduce gathering the sharded optimizer state");
    return whole.cpu();
  });
}

model::Pi05Batch next_batch(TrainingParts& parts, int64_t step, int64_t micro, double* wait_ms) {
  profiler::Scope data_scope(kDataScopeName);
  return parts.source->next(micro_batch_index(parts, step, micro), wait_ms);
}

StepOutcome run_train_step(TrainingParts& parts, int64_t step, double lr, double clip_norm) {
  if (parts.step_graph) return parts.step_graph->run(parts, step, lr, clip_norm);
  QueuedStep q = queue_train_step(parts, step, lr, clip_norm);
  return finish_train_step(parts, q);
}

QueuedStep queue_train_step(TrainingParts& parts, int64_t step, double lr, double clip_norm,
                            const QueuedStep* in_flight) {
  if (parts.step_graph) throw std::logic_error("queue_train_step: this run's steps replay a CUDA graph");
  QueuedStep q;
  q.step = step;
  q.lr = lr;
  q.clip_norm = clip_norm;
  torch::Tensor loss_sum;  // on the device
  for (int64_t micro = 0; micro < parts.grad_accum; ++micro) {
    double wait = 0.0;
    const model::Pi05Batch b = next_batch(parts, step, micro, &wait);
    q.wait_ms += wait;
    if (parts.buckets && micro + 1 == parts.grad_accum) parts.buckets->arm_last_backward();
    const torch::Tensor micro_loss = forward_backward(parts, b, parts.applied.forward, parts.grad_accum);
    loss_sum = loss_sum.defined() ? loss_sum + micro_loss : micro_loss;
  }
  q.norm = queue_optimizer_step(parts, lr, clip_norm, /*device_schedule=*/false,
                                in_flight != nullptr ? in_flight->norm : torch::Tensor());
  const torch::Device device = loss_sum.device();
  torch::Tensor results = q.norm.defined() ? torch::stack({loss_sum.reshape({}), q.norm.to(torch::kFloat64)})
                                           : torch::stack({loss_sum.reshape({}), torch::zeros_like(loss_sum)});
  if (device.is_cuda()) {
    q.host = torch::empty({2}, torch::TensorOptions().dtype(torch::kFloat64).pinned_memory(true));
    q.host.copy_(results, /*non_blocking=*/true);
    c10::impl::VirtualGuardImpl guard(device.type());
    q.done.emplace(device.type(), c10::EventFlag::BACKEND_DEFAULT);  // with timing: the loop times steps by it
    q.done->record(guard.getStream(device));
  } else {
    q.host = results;
  }
  return q;
}

StepOutcome finish_train_step(TrainingParts& parts, QueuedStep& q) {
  if (q.done) q.done->synchronize();
  const double* values = q.host.data_ptr<double>();
  StepOutcome out;
  out.wait_ms = q.wait_ms;
  out.optimizer = parts.optimizer->finish_update(q.lr, q.clip_norm, values[1]);
  out.loss = values[0] / static_cast<double>(parts.grad_accum);
  return out;
}

std::vector<TimedStep> run_timed_steps(TrainingParts& parts, int64_t first, int64_t n, double lr, double clip_norm) {
  if (parts.step_graph || parts.dist) throw std::logic_error("run_timed_steps: eager steps of one process only");
  const torch::Device device = parts.device;
  std::vector<TimedStep> out(static_cast<size_t>(std::max<int64_t>(n, 0)));
  std::vector<std::optional<c10::Event>> starts(out.size());
  std::optional<QueuedStep> in_flight;
  auto finish = [&](size_t i, QueuedStep& q) {
    finish_train_step(parts, q);
    out[i].wait_ms = q.wait_ms;
    if (q.done) out[i].ms = static_cast<double>(starts[i]->elapsedTime(*q.done));
  };
  for (size_t i = 0; i < out.size(); ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    if (device.is_cuda()) {
      c10::impl::VirtualGuardImpl guard(device.type());
      starts[i].emplace(device.type(), c10::EventFlag::BACKEND_DEFAULT);
      starts[i]->record(guard.getStream(device));
    }
    QueuedStep q =
        queue_train_step(parts, first + static_cast<int64_t>(i), lr, clip_norm, in_flight ? &*in_flight : nullptr);
    out[i].ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (in_flight) finish(i - 1, *in_flight);
    in_flight = std::move(q);
  }
  if (in_flight) finish(out.size() - 1, *in_flight);
  return out;
}

}  // namespace vlatune::trainer
