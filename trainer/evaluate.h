// Held-out evaluation of a policy on a packed dataset (a `data import --val-episodes` split: normalized with the
// training statistics, which its manifest carries):
//   (a) the flow-matching loss, exactly the training loss (ForwardOptions' loss_action_dim and precision), with the
//       batch order, noise and time drawn from a fixed seed, so the same weights give the same number;
//   (b) the action error of sampled chunks (model::Sampler, openpi's sample_actions, starting from the same noise)
//       against the ground-truth chunks, both un-normalized with the dataset's norm stats into real units, over the
//       real action dims: mean absolute error and RMSE, overall and per dim.
// `vlatune eval` runs it once; the train loop calls Evaluator::run every N steps and writes the result as a
// metrics.jsonl evaluation row (eval_row below).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "formats/metrics_jsonl.h"
#include "model/config.h"

namespace vlatune::model {
class Pi05Impl;
}

namespace vlatune::trainer {

class Dataset;
class DataSource;
struct TrainOptions;
struct TrainingParts;

struct EvalOptions {
  int64_t batch = 8;              // samples per batch
  int64_t batches = 0;            // 0: dataset size / batch (each sample at most once), at least 1
  uint64_t seed = 0;              // batch order, noise and time: fixed, so evaluations of the same weights agree
  int64_t sample_steps = 10;      // Euler steps per sampled chunk
  int64_t horizon = 0;            // 0: the dataset's chunk length
  int64_t slots = 3;              // camera slots (the dataset's cameras first, the rest masked)
  int workers = 2;                // loader threads
  model::ForwardOptions forward;  // the loss's options (the training run's); sampling uses its precision
};

struct EvalResult {
  int64_t batches = 0, samples = 0;
  double loss = 0;  // mean over batches of each batch's flow-matching loss (equal sizes: the mean over samples)
  double action_mae = 0, action_rmse = 0;  // real units, over samples x horizon x real dims
  std::vector<double> action_mae_per_dim, action_rmse_per_dim;
  double eval_ms = 0;
};

class Evaluator {
 public:
  // Opens and verifies the dataset and starts its loader on `device`. Throws formats::FormatError for a corrupt
  // dataset and std::invalid_argument (naming the dataset) for one that does not fit the model or the options
  // (no norm stats for the actions, fewer samples than one batch, ...).
  Evaluator(const std::string& dataset_dir, const model::Pi05Config& cfg, torch::Device device, EvalOptions options);
  ~Evaluator();
  Evaluator(const Evaluator&) = delete;
  Evaluator& operator=(const Evaluator&) = delete;

  // Evaluates the model's current weights (no autograd; the model is left as it was).
  EvalResult run(model::Pi05Impl& model);

  // "dataset DIR: N samples ..., B batches of S".
  std::string describe() const;
  int64_t action_dim() const { return action_dim_; }  // the real dims reported per dim

 private:
  std::shared_ptr<const Dataset> dataset_;
  std::unique_ptr<DataSource> loader_;
  model::Pi05Config cfg_;
  EvalOptions options_;
  int64_t batches_ = 0;
  int64_t action_dim_ = 0;
};

// The metrics.jsonl evaluation row of `result` for the weights after optimizer step `step`.
formats::EvalRow eval_row(int64_t step, const EvalResult& result, int64_t sample_steps);

// `vlatune train --eval-data DIR [--eval-every N] [--eval-batches N]`: the held-out evaluation of the training model
// after every N-th optimizer step and after the last one (N = 0: after the last only), with the settings of
// `vlatune eval` (seed 0, 10 Euler steps, the dataset's horizon) and the run's micro-batch, camera slots and
// forward options, so its numbers equal `vlatune eval` of the same weights. It reads the trained weights, not the
// EMA. Every process of a data-parallel run evaluates the same batches (no rank waits for another at the next
// collective; the time counts against --dist-timeout); rank 0 writes the rows. With FP8 delayed scaling, the
// evaluation's forwards record their amaxes into the histories as training forwards do.
class TrainEvaluation {
 public:
  // Null when opt.eval_data is empty. A dataset that does not fit: TrainInputError naming --eval-data.
  static std::unique_ptr<TrainEvaluation> open(const TrainOptions& opt, const TrainingParts& parts, std::ostream& log);

  // After optimizer step `step` (0-based) of `total_steps`: when an evaluation is due, runs it, logs one line and
  // returns its row; else nothing.
  std::optional<formats::EvalRow> after_step(int64_t step, int64_t total_steps, model::Pi05Impl& model,
                                             std::ostream& log);
  // Whether after_step(step, total_steps, ...) evaluates.
  bool due(int64_t step, int64_t total_steps) const;

  TrainEvaluation(std::unique_ptr<Evaluator> evaluator, int64_t every, int64_t sample_steps);

 private:
  std::unique_ptr<Evaluator> evaluator_;
  int64_t every_ = 0;
  int64_t sample_steps_ = 10;
};

}  // namespace vlatune::trainer
