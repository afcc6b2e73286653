#include "trainer/image_preprocess.h"

#include <cmath>
#include <stdexcept>
#include <string>

#include "trainer/rng.h"

namespace vlatune::trainer {

namespace F = torch::nn::functional;

std::vector<CameraAugment> draw_augmentation(uint64_t seed, const std::vector<bool>& wrist, int64_t side) {
  SplitMix64 rng(seed);
  std::vector<CameraAugment> out;
  for (bool is_wrist : wrist) {
    CameraAugment a;
    a.geometric = !is_wrist;
    // Every camera consumes the same number of draws, so adding a wrist camera never shifts another's.
    a.crop_side = static_cast<int64_t>(static_cast<double>(side) * 0.95);
    const int64_t max_off = side - a.crop_side;
    a.crop_y = rng.uniform_int(0, max_off);
    a.crop_x = rng.uniform_int(0, max_off);
    a.angle_deg = rng.uniform(-5.0, 5.0);
    a.brightness = rng.uniform(0.7, 1.3);
    a.contrast = rng.uniform(0.6, 1.4);
    a.saturation = rng.uniform(0.5, 1.5);
    out.push_back(a);
  }
  return out;
}

torch::Tensor augment_camera(const torch::Tensor& images01, const CameraAugment& a) {
  torch::Tensor x = images01;
  const int64_t side = x.size(2);
  if (a.geometric) {
    // openpi skips the crop when the image is too small to lose a pixel (max offset 0).
    if (a.crop_side > 0 && a.crop_side < side) {
      x = x.narrow(2, a.crop_y, a.crop_side).narrow(3, a.crop_x, a.crop_side);
      x = F::interpolate(x, F::InterpolateFuncOptions()
                                .size(std::vector<int64_t>{side, side})
                                .mode(torch::kBilinear)
                                .align_corners(false));
    }
    if (std::abs(a.angle_deg) > 0.1) {
      // openpi's grid: linspace(-1, 1) coordinates (not affine_grid's pixel centres), rotated by the angle.
      const double rad = a.angle_deg * M_PI / 180.0;
      const double c = std::cos(rad), s = std::sin(rad);
      auto opts = torch::TensorOptions().dtype(x.scalar_type()).device(x.device());
      auto lin = torch::linspace(-1.0, 1.0, side, opts);
      auto grids = torch::meshgrid({lin, lin}, "ij");  // grids[0] = y, grids[1] = x
      auto gx = grids[1] * c - grids[0] * s;
      auto gy = grids[1] * s + grids[0] * c;
      auto grid = torch::stack({gx, gy}, -1).unsqueeze(0).expand({x.size(0), side, side, 2});
      x = F::grid_sample(
          x, grid, F::GridSampleFuncOptions().mode(torch::kBilinear).padding_mode(torch::kZeros).align_corners(false));
    }
  }
  x = x * a.brightness;
  auto mean = x.mean({1, 2, 3}, /*keepdim=*/true);
  x = (x - mean) * a.contrast + mean;
  auto gray = x.mean({1}, /*keepdim=*/true);
  x = gray + (x - gray) * a.saturation;
  return x.clamp(0.0, 1.0);
}

torch::Tensor preprocess_images(const torch::Tensor& images_u8, int64_t side, int64_t slots,
                                const std::vector<CameraAugment>* augment) {
  if (images_u8.dim() != 5 || images_u8.scalar_type() != torch::kByte || images_u8.size(4) != 3 ||
      images_u8.size(2) != images_u8.size(3))
    throw std::invalid_argument("preprocess_images: expected uint8 [B, cameras, S, S, 3], got " +
                                std::string(c10::toString(images_u8.scalar_type())) + " " +
                                c10::str(images_u8.sizes()));
  const int64_t batch = images_u8.size(0), cameras = images_u8.size(1), stored = images_u8.size(2);
  if (slots < cameras) throw std::invalid_argument("preprocess_images: fewer slots than cameras");
  if (augment != nullptr && static_cast<int64_t>(augment->size()) != cameras)
    throw std::invalid_argument("preprocess_images: one augmentation per camera needed");

  auto out = torch::full({batch, slots, 3, side, side}, -1.0,
                         torch::TensorOptions().dtype(torch::kFloat32).device(images_u8.device()));
  for (int64_t c = 0; c < cameras; ++c) {
    auto x = images_u8.select(1, c).permute({0, 3, 1, 2}).to(torch::kFloat32).div_(255.0);
    if (stored != side)
      x = F::interpolate(x, F::InterpolateFuncOptions()
                                .size(std::vector<int64_t>{side, side})
                                .mode(torch::kBilinear)
                                .align_corners(false));
    if (augment != nullptr) x = augment_camera(x, (*augment)[c]);
    out.select(1, c).copy_(x.mul(2.0).sub_(1.0));
  }
  return out;
}

}  // namespace vlatune::trainer
