// Just enough PNG decoding for screenshot checks: 8-bit RGB/RGBA, non-interlaced (what Chromium writes), via
// zlib. Returns the pixels as RGB triples; throws std::runtime_error on anything else.
#pragma once

#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

namespace vlatune::test {

struct RgbImage {
  uint32_t width = 0, height = 0;
  std::vector<uint8_t> rgb;  // width * height * 3
};

inline RgbImage read_png_rgb(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  const std::vector<uint8_t> b((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  static const uint8_t kSig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (b.size() < 8 || !std::equal(kSig, kSig + 8, b.begin())) throw std::runtime_error(path + ": not a PNG");
  auto be32 = [&](size_t i) {
    return (uint32_t{b[i]} << 24) | (uint32_t{b[i + 1]} << 16) | (uint32_t{b[i + 2]} << 8) | uint32_t{b[i + 3]};
  };
  RgbImage img;
  int color_type = -1;
  std::vector<uint8_t> idat;
  for (size_t p = 8; p + 12 <= b.size();) {
    const uint32_t len = be32(p);
    const std::string type(b.begin() + static_cast<std::ptrdiff_t>(p + 4),
                           b.begin() + static_cast<std::ptrdiff_t>(p + 8));
    if (p + 12 + len > b.size()) throw std::runtime_error(path + ": truncated chunk " + type);
    const uint8_t* data = b.data() + p + 8;
    if (type == "IHDR") {
      img.width = be32(p + 8);
      img.height = be32(p + 12);
      color_type = data[9];
      if (data[8] != 8 || (color_type != 2 && color_type != 6) || data[12] != 0)
        throw std::runtime_error(path + ": only 8-bit RGB/RGBA non-interlaced PNGs are supported");
    } else if (type == "IDAT") {
      idat.insert(idat.end(), data, data + len);
    } else if (type == "IEND") {
      break;
    }
    p += 12 + len;
  }
  if (color_type < 0) throw std::runtime_error(path + ": no IHDR");
  const size_t channels = color_type == 6 ? 4 : 3, stride = img.width * channels;
  std::vector<uint8_t> raw((stride + 1) * img.height);
  uLongf raw_len = raw.size();
  if (uncompress(raw.data(), &raw_len, idat.data(), idat.size()) != Z_OK || raw_len != raw.size())
    throw std::runtime_error(path + ": bad image data");
  // Undo the per-row filters (PNG spec 9.2), in place.
  std::vector<uint8_t> prev(stride, 0);
  img.rgb.reserve(size_t{img.width} * img.height * 3);
  for (uint32_t y = 0; y < img.height; ++y) {
    uint8_t* row = raw.data() + y * (stride + 1);
    const uint8_t filter = row[0];
    uint8_t* px = row + 1;
    for (size_t i = 0; i < stride; ++i) {
      const int a = i >= channels ? px[i - channels] : 0, up = prev[i], c = i >= channels ? prev[i - channels] : 0;
      int pred = 0;
      switch (filter) {
        case 0:
          break;
        case 1:
          pred = a;
          break;
        case 2:
          pred = up;
          break;
        case 3:
          pred = (a + up) / 2;
          break;
        case 4: {
          const int pa = std::abs(up - c), pb = std::abs(a - c), pc = std::abs(a + up - 2 * c);
          pred = pa <= pb && pa <= pc ? a : pb <= pc ? up : c;
          break;
        }
        default:
          throw std::runtime_error(path + ": bad filter type");
      }
      px[i] = static_cast<uint8_t>(px[i] + pred);
    }
    prev.assign(px, px + stride);
    for (uint32_t x = 0; x < img.width; ++x) img.rgb.insert(img.rgb.end(), px + x * channels, px + x * channels + 3);
  }
  return img;
}

}  // namespace vlatune::test
