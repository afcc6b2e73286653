// Image preprocessing on the batch device (spec §10): uint8 HWC camera images -> float [-1, 1] CHW at the
// model's size, with openpi's optional training augmentation. Everything here is tensor ops on whatever device
// the images are on (the GPU at training time), so the loader's host threads only copy bytes.
//
// Augmentation = the openpi PyTorch variant (OPI-PT preprocessing_pytorch.py): ONE random draw per camera per
// batch (not per sample, as openpi JAX does), in [0, 1] space:
//   non-wrist cameras: random crop to int(0.95 * side), bilinear resize back, rotation U(-5, 5) degrees
//                      (applied only when |angle| > 0.1, grid_sample bilinear, zero padding);
//   all cameras:       brightness x U(0.7, 1.3); contrast U(0.6, 1.4) around the per-image mean;
//                      saturation U(0.5, 1.5) against the channel-mean gray; clamp to [0, 1].
// The random numbers are drawn on the host from a seed (no device generator, no host-device sync), so an
// augmented batch is a pure function of (seed, step).
#pragma once

#include <cstdint>
#include <vector>

#include <torch/torch.h>

namespace vlatune::trainer {

struct CameraAugment {
  bool geometric = false;  // crop + rotation (non-wrist cameras only)
  int64_t crop_y = 0, crop_x = 0, crop_side = 0;
  double angle_deg = 0.0;
  double brightness = 1.0, contrast = 1.0, saturation = 1.0;
};

// One draw per camera from `seed`; `wrist[c]` marks wrist cameras; `side` is the model's image size (the crop
// happens after the resize, as in openpi, where images are already 224 when augmented).
std::vector<CameraAugment> draw_augmentation(uint64_t seed, const std::vector<bool>& wrist, int64_t side);

// images_u8: [B, cameras, S, S, 3] uint8 (any device). Returns [B, slots, 3, side, side] float32 in [-1, 1]:
// x / 255, bilinear resize S -> side (align_corners = false; skipped when S == side), the augmentation when
// `augment` is non-null (one entry per camera), then x * 2 - 1. Slots past the cameras are -1 (an all-zero
// uint8 image, spec §5.1). Throws std::invalid_argument on bad shapes.
torch::Tensor preprocess_images(const torch::Tensor& images_u8, int64_t side, int64_t slots,
                                const std::vector<CameraAugment>* augment);

// One camera's augmentation on [B, 3, side, side] float in [0, 1]; exposed for tests.
torch::Tensor augment_camera(const torch::Tensor& images01, const CameraAugment& aug);

}  // namespace vlatune::trainer
