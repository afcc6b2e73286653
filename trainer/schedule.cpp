#include "trainer/schedule.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace vlatune::trainer {

void WarmupCosine::validate() const {
  if (warmup_steps < 0) {
    throw std::invalid_argument("schedule: warmup_steps must be >= 0, got " + std::to_string(warmup_steps));
  }
  if (decay_steps <= warmup_steps) {
    throw std::invalid_argument("schedule: decay_steps (" + std::to_string(decay_steps) +
                                ") must be greater than warmup_steps (" + std::to_string(warmup_steps) +
                                "): the cosine runs over decay_steps - warmup_steps steps");
  }
  if (!std::isfinite(peak_lr) || peak_lr < 0) {
    throw std::invalid_argument("schedule: peak_lr must be a finite rate >= 0, got " + std::to_string(peak_lr));
  }
  if (!std::isfinite(decay_lr) || decay_lr < 0) {
    throw std::invalid_argument("schedule: decay_lr must be a finite rate >= 0, got " + std::to_string(decay_lr));
  }
}

double WarmupCosine::lr(int64_t step) const {
  step = std::max<int64_t>(step, 0);
  if (step < warmup_steps) {
    const double init = peak_lr / static_cast<double>(warmup_steps + 1);
    return init + (peak_lr - init) * static_cast<double>(step) / static_cast<double>(warmup_steps);
  }
  const double length = static_cast<double>(decay_steps - warmup_steps);
  const double progress = std::min(static_cast<double>(step - warmup_steps), length) / length;
  const double kPi = 3.14159265358979323846;
  return decay_lr + (peak_lr - decay_lr) * 0.5 * (1.0 + std::cos(kPi * progress));
}

}  // namespace vlatune::trainer
