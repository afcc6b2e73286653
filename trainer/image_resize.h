// openpi's resize_with_pad on the host, for images entering a dataset: scale to fit inside side x side keeping
// the aspect ratio, then centre on a black side x side canvas (openpi_client.image_tools.resize_with_pad, whose
// numpy path resizes with PIL's BILINEAR filter).
//
// The resampling is PIL's: a separable triangle filter whose support widens with the downscale factor
// (antialiased), horizontal pass first into an 8-bit intermediate, coefficients in 22-bit fixed point, rounded and
// clipped to 0..255. Checked against Pillow 13 on random images: byte-identical for square images and for
// 640x480 -> 224; where Pillow runs the vertical pass first (some portrait shapes) values differ by at most 1.
#pragma once

#include <cstdint>
#include <vector>

namespace vlatune::trainer {

// PIL Image.resize((out_w, out_h), BILINEAR) of an RGB [in_h][in_w][3] image.
std::vector<uint8_t> resize_bilinear_pil(const uint8_t* src, int64_t in_h, int64_t in_w, int64_t out_h, int64_t out_w);

// resize_with_pad(image, side, side): an image already side x side is copied unchanged; otherwise ratio =
// max(w / side, h / side), the image is resized to (int(w / ratio), int(h / ratio)) and pasted at
// (int((side - new_w) / 2), int((side - new_h) / 2)) on zeros. Writes side * side * 3 bytes to `dst`.
void resize_with_pad(const uint8_t* src, int64_t in_h, int64_t in_w, int64_t side, uint8_t* dst);

}  // namespace vlatune::trainer
