// Host-side randomness for data: a tiny, fully specified generator (SplitMix64) and the seed derivation that
// makes every random choice of the data pipeline a pure function of (seed, step) or (seed, sample).
// Not std::mt19937 + std::uniform_*_distribution: the standard leaves the distributions implementation-defined,
// and a dataset written with `--seed 7` must be the same bytes with any compiler.
#pragma once

#include <cstdint>

namespace vlatune::trainer {

// Independent streams derived from one user seed (so the sample order, the augmentation and the noise of one
// step never share random numbers).
enum class RngStream : uint64_t {
  kSynthSample = 1,    // synthetic dataset: one stream per sample index
  kEpochOrder = 2,     // loader: one permutation per epoch
  kAugment = 3,        // loader: augmentation parameters per step
  kNoiseTime = 4,      // flow-matching noise and time per step (device generator seed)
  kSyntheticBatch = 5  // on-the-fly synthetic batches per step (device generator seed)
};

// A well-mixed 64-bit seed for (seed, stream, index): SplitMix64's finalizer applied in a chain.
uint64_t derive_seed(uint64_t seed, RngStream stream, uint64_t index);

// SplitMix64 (Vigna): 64-bit state, passes BigCrush, trivially reproducible.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next();
  // Uniform in [lo, hi] (inclusive), by a 128-bit multiply (Lemire): no modulo bias worth mentioning.
  int64_t uniform_int(int64_t lo, int64_t hi);
  // Uniform in [lo, hi) with 53 random bits.
  double uniform(double lo, double hi);
  // Fills `bytes` with random bytes (8 at a time).
  void fill_bytes(uint8_t* out, int64_t bytes);

 private:
  uint64_t state_;
};

}  // namespace vlatune::trainer
