#include "trainer/image_resize.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

namespace vlatune::trainer {

namespace {

constexpr int kPrecisionBits = 32 - 8 - 2;  // PIL's fixed point for 8-bit images

// PIL's precompute_coeffs for the bilinear (triangle) filter, then normalize_coeffs_8bpc: for each output
// position its first input index, tap count and fixed-point weights.
struct Taps {
  std::vector<int> first, count;
  std::vector<int> weights;  // count_max per output
  int count_max = 0;
};

Taps precompute(int64_t in_size, int64_t out_size) {
  const double scale = static_cast<double>(in_size) / static_cast<double>(out_size);
  const double filterscale = std::max(scale, 1.0);
  const double support = 1.0 * filterscale;  // the bilinear filter's support is 1
  Taps t;
  t.count_max = static_cast<int>(std::ceil(support)) * 2 + 1;
  t.first.resize(static_cast<size_t>(out_size));
  t.count.resize(static_cast<size_t>(out_size));
  t.weights.assign(static_cast<size_t>(out_size * t.count_max), 0);
  std::vector<double> k(static_cast<size_t>(t.count_max));
  const double ss = 1.0 / filterscale;
  for (int64_t xx = 0; xx < out_size; ++xx) {
    const double center = (static_cast<double>(xx) + 0.5) * scale;
    int64_t xmin = static_cast<int64_t>(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int64_t xmax = static_cast<int64_t>(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    double ww = 0.0;
    for (int64_t x = 0; x < xmax; ++x) {
      const double arg = (static_cast<double>(x + xmin) - center + 0.5) * ss;
      const double w = std::abs(arg) < 1.0 ? 1.0 - std::abs(arg) : 0.0;
      k[static_cast<size_t>(x)] = w;
      ww += w;
    }
    for (int64_t x = 0; x < xmax; ++x) {
      const double v = ww != 0.0 ? k[static_cast<size_t>(x)] / ww : 0.0;
      t.weights[static_cast<size_t>(xx * t.count_max + x)] = v < 0 ? static_cast<int>(-0.5 + v * (1 << kPrecisionBits))
                                                                   : static_cast<int>(0.5 + v * (1 << kPrecisionBits));
    }
    t.first[static_cast<size_t>(xx)] = static_cast<int>(xmin);
    t.count[static_cast<size_t>(xx)] = static_cast<int>(xmax);
  }
  return t;
}

inline uint8_t clip8(int64_t v) {
  v >>= kPrecisionBits;
  return static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
}

}  // namespace

std::vector<uint8_t> resize_bilinear_pil(const uint8_t* src, int64_t in_h, int64_t in_w, int64_t out_h, int64_t out_w) {
  if (in_h < 1 || in_w < 1 || out_h < 1 || out_w < 1)
    throw std::invalid_argument("resize: sizes must be positive, got " + std::to_string(in_w) + "x" +
                                std::to_string(in_h) + " -> " + std::to_string(out_w) + "x" + std::to_string(out_h));
  // Horizontal pass (skipped when the width stays), as PIL: into an 8-bit image of the input's height.
  std::vector<uint8_t> horizontal;
  const uint8_t* rows = src;
  if (out_w != in_w) {
    const Taps t = precompute(in_w, out_w);
    horizontal.resize(static_cast<size_t>(in_h * out_w * 3));
    for (int64_t y = 0; y < in_h; ++y) {
      const uint8_t* in = src + y * in_w * 3;
      uint8_t* out = horizontal.data() + y * out_w * 3;
      for (int64_t xx = 0; xx < out_w; ++xx) {
        const int* w = &t.weights[static_cast<size_t>(xx * t.count_max)];
        const int x0 = t.first[static_cast<size_t>(xx)], n = t.count[static_cast<size_t>(xx)];
        for (int c = 0; c < 3; ++c) {
          int64_t acc = 1 << (kPrecisionBits - 1);
          for (int x = 0; x < n; ++x) acc += static_cast<int64_t>(in[(x0 + x) * 3 + c]) * w[x];
          out[xx * 3 + c] = clip8(acc);
        }
      }
    }
    rows = horizontal.data();
  }
  const int64_t width = out_w;
  if (out_h == in_h) {
    if (out_w != in_w) return horizontal;
    return std::vector<uint8_t>(src, src + in_h * in_w * 3);
  }
  const Taps t = precompute(in_h, out_h);
  std::vector<uint8_t> out(static_cast<size_t>(out_h * width * 3));
  for (int64_t yy = 0; yy < out_h; ++yy) {
    const int* w = &t.weights[static_cast<size_t>(yy * t.count_max)];
    const int y0 = t.first[static_cast<size_t>(yy)], n = t.count[static_cast<size_t>(yy)];
    uint8_t* o = out.data() + yy * width * 3;
    for (int64_t i = 0; i < width * 3; ++i) {
      int64_t acc = 1 << (kPrecisionBits - 1);
      for (int y = 0; y < n; ++y) acc += static_cast<int64_t>(rows[(y0 + y) * width * 3 + i]) * w[y];
      o[i] = clip8(acc);
    }
  }
  return out;
}

void resize_with_pad(const uint8_t* src, int64_t in_h, int64_t in_w, int64_t side, uint8_t* dst) {
  if (in_h == side && in_w == side) {
    std::memcpy(dst, src, static_cast<size_t>(side * side * 3));
    return;
  }
  const double ratio = std::max(static_cast<double>(in_w) / static_cast<double>(side),
                                static_cast<double>(in_h) / static_cast<double>(side));
  const auto new_h = std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(in_h) / ratio));
  const auto new_w = std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(in_w) / ratio));
  const auto resized = resize_bilinear_pil(src, in_h, in_w, new_h, new_w);
  const int64_t pad_h = std::max<int64_t>(0, (side - new_h) / 2), pad_w = std::max<int64_t>(0, (side - new_w) / 2);
  std::memset(dst, 0, static_cast<size_t>(side * side * 3));
  for (int64_t y = 0; y < new_h && y + pad_h < side; ++y)
    std::memcpy(dst + ((y + pad_h) * side + pad_w) * 3, resized.data() + y * new_w * 3,
                static_cast<size_t>(std::min(new_w, side - pad_w) * 3));
}

}  // namespace vlatune::trainer
