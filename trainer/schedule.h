// Learning-rate schedule: openpi's CosineDecaySchedule (optax.warmup_cosine_decay_schedule), which openpi's
// PyTorch trainer replicates by hand (spec §9.1, §9.2). `step` is the 0-based index of the optimizer update
// (optax's count: 0 for the first update).
//
//   step < W:  lr = init + (peak - init) * step / W,         init = peak / (W + 1)
//   step >= W: lr = decay_lr + (peak - decay_lr) * 0.5 * (1 + cos(pi * min(step - W, D - W) / (D - W)))
//
// with W = warmup_steps, D = decay_steps. So the first update uses peak/(W+1), step W uses exactly peak, and
// from step D on the rate stays at decay_lr. W = 0 starts the cosine at step 0. pi05_libero: W 10,000,
// peak 5e-5, D 1,000,000, decay_lr 5e-5 (peak == decay_lr: constant 5e-5 after warmup). Computed in double
// (optax computes in fp32; the difference is below fp32 rounding of the result).
#pragma once

#include <cstdint>

namespace vlatune::trainer {

struct WarmupCosine {
  int64_t warmup_steps = 10000;
  double peak_lr = 5e-5;
  int64_t decay_steps = 1000000;
  double decay_lr = 5e-5;

  // Throws std::invalid_argument naming the field when warmup_steps < 0, decay_steps <= warmup_steps (optax
  // needs a positive cosine length), or a rate is negative or not finite.
  void validate() const;
  // The learning rate of the 0-based update `step` (step < 0 is treated as 0).
  double lr(int64_t step) const;
};

}  // namespace vlatune::trainer
