#include "trainer/rng.h"

#include <cstring>

namespace vlatune::trainer {

namespace {
inline uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}
constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ULL;
}  // namespace

uint64_t derive_seed(uint64_t seed, RngStream stream, uint64_t index) {
  uint64_t h = mix(seed + kGolden);
  h = mix(h ^ (static_cast<uint64_t>(stream) * kGolden));
  return mix(h ^ (index + kGolden));
}

uint64_t SplitMix64::next() {
  state_ += kGolden;
  return mix(state_);
}

int64_t SplitMix64::uniform_int(int64_t lo, int64_t hi) {
  const auto range = static_cast<unsigned __int128>(static_cast<uint64_t>(hi - lo) + 1);
  return lo + static_cast<int64_t>((static_cast<unsigned __int128>(next()) * range) >> 64);
}

double SplitMix64::uniform(double lo, double hi) {
  const double u = static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0);
  return lo + (hi - lo) * u;
}

void SplitMix64::fill_bytes(uint8_t* out, int64_t bytes) {
  int64_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    const uint64_t v = next();
    std::memcpy(out + i, &v, 8);
  }
  if (i < bytes) {
    const uint64_t v = next();
    std::memcpy(out + i, &v, static_cast<size_t>(bytes - i));
  }
}

}  // namespace vlatune::trainer
