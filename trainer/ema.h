// Exponential moving average of the parameters (openpi pi05_libero: decay 0.999, every step, all parameters;
// the EMA weights are what openpi saves for inference). Shadow copies are fp32 whatever the parameters' dtype,
// so a bf16 model's average does not stall on bf16 rounding (at decay 0.999 a bf16 shadow would lose every
// update smaller than 2^-8 of the weight).
//
//   shadow = decay * shadow + (1 - decay) * param        (optax/openpi order; starts at the initial params)
//
// Call update() after every applied optimizer step (not after a skipped one).
#pragma once

#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

namespace vlatune::trainer {

class Ema {
 public:
  // Keeps the parameter tensors (shared storage with the model) and fp32 clones of them as the shadow.
  Ema(std::vector<std::pair<std::string, torch::Tensor>> named_params, double decay);

  void update();
  // Copies the shadow into `named` (rounded to each tensor's dtype), matched by name; every name must exist.
  void apply_to(const std::vector<std::pair<std::string, torch::Tensor>>& named) const;
  // Copies the shadow into the tracked parameters themselves.
  void apply_to_params() const;

  double decay() const { return decay_; }
  // The shadow as named tensors ("<fqn>"), live views (clone to keep past the next update); for checkpoints.
  std::vector<std::pair<std::string, torch::Tensor>> state() const;
  // Restores the shadow; names, shapes must match state() of an Ema over the same parameters.
  void load_state(const std::vector<std::pair<std::string, torch::Tensor>>& state);

 private:
  std::vector<std::string> names_;
  std::vector<torch::Tensor> params_;
  std::vector<torch::Tensor> shadow_;
  double decay_;
};

}  // namespace vlatune::trainer
