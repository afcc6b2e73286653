#include "trainer/train_step.h"

#include "model/state_dict.h"
#include "profiler/scope.h"
#include "trainer/environment.h"

namespace vlatune::trainer {

namespace {
// Scopes keep a reference to their name: these outlive every step.
const std::string kDataScopeName = profiler::kDataScope;
const std::string kOptimizerScopeName = profiler::kOptimizerScope;
}  // namespace

TrainingParts build_training_parts(const TrainOptions& opt, const formats::Recipe& recipe,
                                   const std::string& recipe_label, bool load_init_weights, std::ostream& log) {
  TrainingParts parts;
  try {
    parts.config = model::Pi05Config::named(opt.config);
  } catch (const std::invalid_argument& e) {
    throw TrainInputError(std::string("--config: ") + e.what());
  }
  try {
    parts.device = resolve_device("--device", opt.device);
  } catch (const std::invalid_argument& e) {
    throw TrainInputError(e.what());
  }
  parts.batch = opt.batch.value_or(recipe.batch.micro_batch);
  parts.grad_accum = opt.grad_accum.value_or(recipe.batch.grad_accum);
  parts.precision = opt.precision.value_or(formats::to_string(recipe.model_options.precision));
  if (parts.batch < 1 || parts.grad_accum < 1) throw TrainInputError("--batch and grad_accum must be >= 1");
  const OptimizerPrecision opt_precision = parse_optimizer_precision(parts.precision);

  // Model: parameters in bf16 on the GPU ("bf16" precision) or fp32 ("fp32-master" on the GPU: fp32 master
  // weights in the optimizer, bf16 compute; the CPU tiny config computes in fp32 either way).
  const bool cuda = parts.device.is_cuda();
  const torch::Dtype param_dtype =
      cuda && opt_precision == OptimizerPrecision::kBf16 ? torch::kBFloat16 : torch::kFloat32;
  parts.net = model::Pi05(parts.config, parts.device, param_dtype);
  model::init_weights(*parts.net, opt.seed);
  if (!opt.init_weights.empty() && load_init_weights) {
    auto report = model::load_state_dict(*parts.net, opt.init_weights, /*strict=*/false);
    if (!report.missing.empty() || !report.shape_mismatched.empty())
      throw TrainInputError("--init-weights: " + report.summary());
    log << "init weights: " << report.summary() << "\n";
  }
  parts.applied = apply_recipe(recipe, recipe_label, *parts.net);
  parts.applied.forward.loss_action_dim = opt.loss_action_dim;
  if (cuda && opt_precision == OptimizerPrecision::kFp32Master) parts.applied.forward.compute_dtype = torch::kBFloat16;

  open_training_data(parts, opt, parts.batch);

  for (const auto& item : parts.net->named_parameters()) parts.named_params.emplace_back(item.key(), item.value());
  AdamWOptions adam;
  adam.lr = opt.lr;
  adam.betas = {opt.beta1, opt.beta2};
  adam.eps = opt.eps;
  adam.weight_decay = opt.weight_decay;
  adam.precision = opt_precision;
  parts.optimizer = std::make_unique<AdamW>(parts.named_params, adam);
  return parts;
}

void open_training_data(TrainingParts& parts, const TrainOptions& opt, int64_t batch) {
  LoaderOptions loader;
  loader.workers = opt.workers;
  loader.augment = opt.augment;
  if (parts.applied.num_images) loader.slots = *parts.applied.num_images;
  parts.source.reset();  // stop the old loader's workers first
  try {
    parts.source = open_data_source(opt.data, parts.config, batch, opt.seed, parts.device, loader);
  } catch (const std::invalid_argument& e) {
    throw TrainInputError(std::string("--data: ") + e.what());
  }
  parts.batch = batch;
}

StepOutcome run_train_step(TrainingParts& parts, int64_t step, double lr, double clip_norm) {
  StepOutcome out;
  double loss_sum = 0.0;
  for (int64_t micro = 0; micro < parts.grad_accum; ++micro) {
    double wait = 0.0;
    model::Pi05Batch b = [&] {
      profiler::Scope data_scope(kDataScopeName);
      return parts.source->next(step * parts.grad_accum + micro, &wait);
    }();
    out.wait_ms += wait;
    auto result = parts.net->forward(b, parts.applied.forward);
    torch::Tensor loss = parts.grad_accum > 1 ? result.loss / static_cast<double>(parts.grad_accum) : result.loss;
    loss.backward();
    loss_sum += result.loss.detach().to(torch::kFloat64).item<double>();  // per-step sync: the loss is logged
  }
  {
    profiler::Scope optimizer_scope(kOptimizerScopeName, profiler::Phase::kOptimizer);
    parts.net->fill_missing_grads();
    out.optimizer = parts.optimizer->step(lr, clip_norm);
    parts.optimizer->zero_grad();
  }
  out.loss = loss_sum / static_cast<double>(parts.grad_accum);
  return out;
}

}  // namespace vlatune::trainer
