// LIBERO-shaped synthetic data, in two forms with one distribution:
//   write_synthetic_dataset: a packed dataset on disk (`vlatune data synth`), for loader benchmarks and tests;
//   SyntheticSource:         batches generated directly on the batch device (`--data synthetic`), the benchmark
//                            setting: no host work and no copies in the training loop.
// Distribution (as model::make_random_batch): 2 cameras of uniform pixels, prompts of uniform length in
// [min, max] with ids uniform in [1, vocab) right-padded with 0 to 200, 7 real action dims uniform in [-1, 1]
// (zero-padded to 32), horizon 50, state 8 dims uniform in [-1, 1]; noise N(0, 1) and time as the trainer's.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "trainer/data_source.h"
#include "trainer/dataset.h"

namespace vlatune::trainer {

struct SynthOptions {
  std::string config = "tiny";  // image side and vocabulary from model::Pi05Config::named(config)
  int64_t samples = 0;
  uint64_t seed = 0;
  int64_t min_prompt = 20, max_prompt = 199;  // real prompt tokens (BOS counts), padded to text_len
  int64_t text_len = 200;
  int64_t horizon = 50;
  int64_t cameras = 2;
  int64_t action_dim = 7;
  int64_t state_dim = 8;
  std::string out;
  int64_t shard_bytes = 1LL << 30;
};

// Writes the dataset; sample i depends only on (seed, i), so the bytes are the same for a seed on any machine.
// Raw actions and states are uniform in [-1, 1] and the stored statistics are that support (q01 = -1,
// q99 = 1), normalized with the same formula an import uses. Throws std::invalid_argument for bad options
// (naming the option), std::runtime_error for I/O: formats::WriteError, before anything is written, when the
// filesystem has too little space for the dataset.
DatasetManifest write_synthetic_dataset(const SynthOptions& options);

// Parses "MIN:MAX" (the --prompt-len value) with 0 <= MIN <= MAX; throws std::invalid_argument with the expected
// form.
std::pair<int64_t, int64_t> parse_prompt_range(const std::string& text);

class SyntheticSource : public DataSource {
 public:
  SyntheticSource(const model::Pi05Config& cfg, int64_t batch, uint64_t seed, torch::Device device,
                  const LoaderOptions& options);
  model::Pi05Batch next(int64_t step, double* wait_ms) override;
  DataPosition position() const override;
  std::string describe() const override;
  int64_t text_len() const override;

 private:
  model::Pi05Config cfg_;
  int64_t batch_;
  uint64_t seed_;
  torch::Device device_;
  LoaderOptions options_;
  int64_t horizon_;
  at::Generator gen_;
  int64_t next_step_ = 0;
};

}  // namespace vlatune::trainer
