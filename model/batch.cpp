#include "model/batch.h"

#include <stdexcept>
#include <string>

namespace vlatune::model {

Pi05Batch make_random_batch(const Pi05Config& cfg, int64_t batch, int64_t slots, int64_t valid_slots, int64_t text_len,
                            int64_t min_prompt, int64_t max_prompt, int64_t horizon, torch::Generator* generator,
                            torch::Device device) {
  auto fail = [](const std::string& what) { throw std::invalid_argument("make_random_batch: " + what); };
  if (batch < 1 || horizon < 1) fail("batch and horizon must be positive");
  if (slots < 0 || valid_slots < 0 || valid_slots > slots) fail("need 0 <= valid_slots <= slots");
  if (min_prompt < 0 || min_prompt > max_prompt || max_prompt > text_len)
    fail("need 0 <= min_prompt <= max_prompt <= text_len (got " + std::to_string(min_prompt) + ", " +
         std::to_string(max_prompt) + ", " + std::to_string(text_len) + ")");
  std::optional<at::Generator> gen;
  if (generator != nullptr) gen = *generator;
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
  const auto i64 = torch::TensorOptions().dtype(torch::kLong);
  const int64_t side = cfg.vision.image;

  Pi05Batch b;
  b.image_masks = (torch::arange(slots, i64) < valid_slots).unsqueeze(0).expand({batch, slots}).contiguous();
  b.images = torch::empty({batch, slots, 3, side, side}, f32).uniform_(-1.0, 1.0, gen);
  if (valid_slots < slots) b.images.narrow(1, valid_slots, slots - valid_slots).fill_(-1.0);  // empty camera

  auto lengths = torch::randint(min_prompt, max_prompt + 1, {batch}, gen, i64);
  b.token_masks = torch::arange(text_len, i64).unsqueeze(0) < lengths.unsqueeze(1);
  b.tokens = torch::randint(1, cfg.backbone.vocab, {batch, text_len}, gen, i64) * b.token_masks.to(torch::kLong);

  b.actions = torch::empty({batch, horizon, cfg.action_dim}, f32).uniform_(-1.0, 1.0, gen);
  b.noise = torch::randn({batch, horizon, cfg.action_dim}, gen, f32);
  // Beta(1.5, 1) has CDF t^1.5, so U^(1/1.5) samples it exactly.
  auto u = torch::empty({batch}, f32).uniform_(0.0, 1.0, gen);
  b.time = u.pow(1.0 / 1.5) * 0.999 + 0.001;

  for (torch::Tensor* t : batch_tensors(b)) *t = t->to(device);
  return b;
}

std::array<torch::Tensor*, 7> batch_tensors(Pi05Batch& b) {
  return {&b.images, &b.image_masks, &b.tokens, &b.token_masks, &b.actions, &b.noise, &b.time};
}

std::array<const torch::Tensor*, 7> batch_tensors(const Pi05Batch& b) {
  return {&b.images, &b.image_masks, &b.tokens, &b.token_masks, &b.actions, &b.noise, &b.time};
}

Pi05Batch batch_to(const Pi05Batch& batch, c10::ScalarType dtype) {
  Pi05Batch b = batch;
  b.images = batch.images.to(dtype);
  b.actions = batch.actions.to(dtype);
  b.noise = batch.noise.to(dtype);
  b.time = batch.time.to(dtype);
  return b;
}

}  // namespace vlatune::model
