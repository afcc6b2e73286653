// The code maps of the 8-bit AdamW state (adamw.h, AdamwQuantMaps). Torch-free.
//
// Dynamic tree quantization (Dettmers et al. 2021, §2; bitsandbytes' create_dynamic_map with 7 exponent bits):
// decade e = 0..6 covers [0.1, 1] * 10^(e-6) with linearly spaced points, the last decade with the most. The signed
// map spends 2^e points on each sign of decade e (127 per sign), the unsigned map 2^(e+1) (254), and both add 0
// and 1. Why this map and not a linear one: a block of 256 moments spans several orders of magnitude (one large
// gradient coordinate sets the absmax); a linear map would round everything below absmax/254 to 0, and a zero
// second moment turns the update into m / eps. The dynamic map keeps relative precision down to ~1e-6 * absmax.
// Computed in double and rounded once; the reference and the kernel read the same table.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "kernels/adamw.h"

namespace vlatune::kernels {

namespace {

constexpr int kExponentBits = 7;

void dynamic_map(bool is_signed, float* out) {
  std::vector<double> data;
  for (int e = 0; e < kExponentBits; ++e) {
    const int points = is_signed ? 1 << e : 1 << (e + 1);
    const double decade = std::pow(10.0, e - (kExponentBits - 1));
    // The means of neighbouring points of linspace(0.1, 1, points + 1).
    for (int k = 0; k < points; ++k) {
      const double lo = 0.1 + 0.9 * k / points, hi = 0.1 + 0.9 * (k + 1) / points;
      const double mean = decade * (lo + hi) / 2;
      data.push_back(mean);
      if (is_signed) data.push_back(-mean);
    }
  }
  data.push_back(0.0);
  data.push_back(1.0);
  if (data.size() != 256) throw std::logic_error("adamw_quant_maps: the dynamic map does not have 256 points");
  std::sort(data.begin(), data.end());
  for (size_t i = 0; i < data.size(); ++i) out[i] = static_cast<float>(data[i]);
}

uint8_t zero_code(const float* map) {
  return static_cast<uint8_t>(std::find(map, map + 256, 0.0f) - map);
}

AdamwQuantMaps make_maps() {
  AdamwQuantMaps maps;
  dynamic_map(/*is_signed=*/true, maps.exp_avg);
  dynamic_map(/*is_signed=*/false, maps.exp_avg_sq);
  maps.exp_avg_zero = zero_code(maps.exp_avg);
  maps.exp_avg_sq_zero = zero_code(maps.exp_avg_sq);
  return maps;
}

}  // namespace

const AdamwQuantMaps& adamw_quant_maps() {
  static const AdamwQuantMaps maps = make_maps();
  return maps;
}

}  // namespace vlatune::kernels
