#include "trainer/evaluate.h"

#include <chrono>
#include <cmath>
#include <iomanip>
#include <stdexcept>

#include "model/pi05.h"
#include "model/sample.h"
#include "trainer/dataset.h"
#include "trainer/loader.h"
#include "trainer/norm_stats.h"
#include "trainer/train_loop.h"
#include "trainer/train_step.h"

namespace vlatune::trainer {

Evaluator::Evaluator(const std::string& dataset_dir, const model::Pi05Config& cfg, torch::Device device,
                     EvalOptions options)
    : cfg_(cfg), options_(std::move(options)) {
  auto fail = [&](const std::string& why) {
    throw std::invalid_argument("evaluation dataset " + dataset_dir + ": " + why);
  };
  if (options_.batch < 1) fail("the batch must be >= 1");
  if (options_.batches < 0) fail("the number of batches must be >= 0");
  if (options_.sample_steps < 1) fail("sample steps must be >= 1");
  dataset_ = Dataset::open(dataset_dir);
  const DatasetManifest& m = dataset_->manifest();
  action_dim_ = m.layout.action_dim;  // the manifest's reader checked that its action stats cover these dims
  // A held-out split smaller than one batch is evaluated as one batch of all its samples.
  const int64_t batch = std::min(options_.batch, dataset_->size());
  options_.batch = batch;
  batches_ = options_.batches > 0 ? options_.batches : std::max<int64_t>(1, dataset_->size() / batch);
  LoaderOptions lo;
  lo.workers = options_.workers;
  lo.prefetch = 2;
  lo.slots = options_.slots;
  lo.horizon = options_.horizon;
  lo.augment = false;
  loader_ = std::make_unique<DatasetLoader>(dataset_, cfg_, batch, options_.seed, device, lo);
}

Evaluator::~Evaluator() = default;

std::string Evaluator::describe() const {
  return loader_->describe() + "; " + std::to_string(batches_) + " batches of " + std::to_string(options_.batch) +
         ", " + std::to_string(options_.sample_steps) + " Euler steps per chunk, seed " + std::to_string(options_.seed);
}

EvalResult Evaluator::run(model::Pi05Impl& model) {
  torch::NoGradGuard no_grad;
  const auto t0 = std::chrono::steady_clock::now();
  model::SampleOptions so;
  so.num_steps = options_.sample_steps;
  so.forward = options_.forward;
  model::Sampler sampler(model, so);  // per run: the weights may have changed since the last one
  const QuantileStats& stats = dataset_->manifest().norm.actions;
  const int64_t width = cfg_.action_dim, d = action_dim_;
  std::vector<double> abs_sum(static_cast<size_t>(d), 0.0), sq_sum(static_cast<size_t>(d), 0.0);
  double loss_sum = 0;
  int64_t rows = 0;
  EvalResult r;
  for (int64_t step = 0; step < batches_; ++step) {
    const model::Pi05Batch batch = loader_->next(step, nullptr);
    loss_sum += model.forward(batch, options_.forward).loss.item<double>();
    torch::Tensor pred = sampler.sample(batch, batch.noise).to(torch::kCPU, torch::kFloat32).contiguous();
    torch::Tensor truth = batch.actions.to(torch::kCPU, torch::kFloat32).contiguous().clone();
    const int64_t n = pred.numel() / width;
    unnormalize_quantile(pred.data_ptr<float>(), n, width, stats);
    unnormalize_quantile(truth.data_ptr<float>(), n, width, stats);
    const float* p = pred.data_ptr<float>();
    const float* t = truth.data_ptr<float>();
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < d; ++j) {
        const double diff = static_cast<double>(p[i * width + j]) - static_cast<double>(t[i * width + j]);
        abs_sum[static_cast<size_t>(j)] += std::abs(diff);
        sq_sum[static_cast<size_t>(j)] += diff * diff;
      }
    }
    rows += n;
    r.samples += batch.tokens.size(0);
  }
  r.batches = batches_;
  r.loss = loss_sum / static_cast<double>(batches_);
  double abs_total = 0, sq_total = 0;
  for (int64_t j = 0; j < d; ++j) {
    const auto k = static_cast<size_t>(j);
    r.action_mae_per_dim.push_back(abs_sum[k] / static_cast<double>(rows));
    r.action_rmse_per_dim.push_back(std::sqrt(sq_sum[k] / static_cast<double>(rows)));
    abs_total += abs_sum[k];
    sq_total += sq_sum[k];
  }
  r.action_mae = abs_total / static_cast<double>(rows * d);
  r.action_rmse = std::sqrt(sq_total / static_cast<double>(rows * d));
  r.eval_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

formats::EvalRow eval_row(int64_t step, const EvalResult& result, int64_t sample_steps) {
  formats::EvalRow row;
  row.step = step;
  row.loss = result.loss;
  row.action_mae = result.action_mae;
  row.action_rmse = result.action_rmse;
  row.action_mae_per_dim = result.action_mae_per_dim;
  row.action_rmse_per_dim = result.action_rmse_per_dim;
  row.samples = result.samples;
  row.batches = result.batches;
  row.sample_steps = sample_steps;
  row.eval_ms = result.eval_ms;
  return row;
}

std::unique_ptr<TrainEvaluation> TrainEvaluation::open(const TrainOptions& opt, const TrainingParts& parts,
                                                       std::ostream& log) {
  if (opt.eval_data.empty()) {
    if (opt.eval_every != 0 || opt.eval_batches != 0)
      throw TrainInputError("--eval-every and --eval-batches need --eval-data DATASET");
    return nullptr;
  }
  if (opt.eval_every < 0) throw TrainInputError("--eval-every must be >= 0");
  if (opt.eval_batches < 0) throw TrainInputError("--eval-batches must be >= 0");
  EvalOptions o;
  o.batch = parts.batch;
  o.batches = opt.eval_batches;
  o.slots = parts.applied.num_images.value_or(o.slots);
  o.workers = 1;
  o.forward = parts.applied.forward;
  std::unique_ptr<Evaluator> evaluator;
  try {
    evaluator = std::make_unique<Evaluator>(opt.eval_data, parts.config, parts.device, o);
  } catch (const std::exception& e) {  // invalid_argument (does not fit) or FormatError (corrupt)
    throw TrainInputError(std::string("--eval-data: ") + e.what());
  }
  log << "held-out evaluation " << (opt.eval_every > 0 ? "every " + std::to_string(opt.eval_every) + " steps and " : "")
      << "after the last step: " << evaluator->describe() << "\n";
  return std::make_unique<TrainEvaluation>(std::move(evaluator), opt.eval_every, o.sample_steps);
}

TrainEvaluation::TrainEvaluation(std::unique_ptr<Evaluator> evaluator, int64_t every, int64_t sample_steps)
    : evaluator_(std::move(evaluator)), every_(every), sample_steps_(sample_steps) {}

bool TrainEvaluation::due(int64_t step, int64_t total_steps) const {
  const int64_t done = step + 1;
  return done == total_steps || (every_ > 0 && done % every_ == 0);
}

std::optional<formats::EvalRow> TrainEvaluation::after_step(int64_t step, int64_t total_steps, model::Pi05Impl& model,
                                                            std::ostream& log) {
  if (!due(step, total_steps)) return std::nullopt;
  const int64_t done = step + 1;
  const EvalResult r = evaluator_->run(model);
  log << "eval after step " << done << "/" << total_steps << " | loss " << std::setprecision(6) << r.loss
      << " | action MAE " << std::setprecision(4) << r.action_mae << " RMSE " << r.action_rmse << " (real units, "
      << r.samples << " samples) | " << std::fixed << std::setprecision(1) << r.eval_ms << " ms" << std::defaultfloat
      << "\n";
  return eval_row(step, r, sample_steps_);
}

}  // namespace vlatune::trainer
