// The tiny-config training run the torch tests start from: synthetic data on the CPU, batch 2, one loader worker,
// no progress bar, a fixed seed and a short warmup, so a few steps finish in seconds and repeat bit for bit. A test
// that needs something else sets those fields on the returned options; the op-count baseline
// (reports/baselines/cpu/tiny_train_step_ops.json) was recorded from these values with its own two changes.
#pragma once

#include <cstdint>
#include <string>

#include "trainer/train_loop.h"

namespace vlatune::test {

inline trainer::TrainOptions tiny_train_options(const std::string& out, int64_t steps) {
  trainer::TrainOptions o;
  o.config = "tiny";
  o.data = "synthetic";
  o.device = "cpu";
  o.out = out;
  o.steps = steps;
  o.batch = 2;
  o.lr = 1e-3;
  o.warmup_steps = 2;
  o.checkpoint_every = 2;
  o.timing_warmup = 1;
  o.workers = 1;
  o.progress_bar = false;
  o.seed = 5;
  return o;
}

}  // namespace vlatune::test
