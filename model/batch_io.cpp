#include "model/batch_io.h"

#include <sstream>
#include <stdexcept>
#include <utility>
#include <vector>

#include "model/safetensors_io.h"

namespace vlatune::model {

namespace {

std::string shape_text(at::IntArrayRef shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  return os.str() + "]";
}

class BatchReader {
 public:
  BatchReader(const std::string& path) : path_(path), file_(SafetensorsFile::open(path)) {}

  [[noreturn]] void fail(const std::string& name, const std::string& reason) const {
    throw std::invalid_argument(path_ + ": tensor '" + name + "': " + reason);
  }

  bool has(const std::string& name) const { return file_.contains(name); }

  torch::Tensor get(const std::string& name, int64_t dims, std::initializer_list<c10::ScalarType> dtypes) const {
    if (!file_.contains(name))
      fail(name,
           "missing (a batch holds images, image_masks, tokens, token_masks, actions, "
           "noise, time)");
    torch::Tensor t = file_.tensor(name);
    bool dtype_ok = false;
    for (auto d : dtypes) dtype_ok = dtype_ok || t.scalar_type() == d;
    if (!dtype_ok) fail(name, std::string("unsupported dtype ") + c10::toString(t.scalar_type()));
    if (t.dim() != dims) fail(name, "expected " + std::to_string(dims) + " dimensions, got " + shape_text(t.sizes()));
    return t;
  }

  void expect_shape(const std::string& name, const torch::Tensor& t, std::vector<int64_t> expected) const {
    if (t.sizes() != at::IntArrayRef(expected))
      fail(name, "expected shape " + shape_text(expected) + ", got " + shape_text(t.sizes()));
  }

  torch::Tensor mask(const std::string& name, int64_t dims) const {
    torch::Tensor t = get(name, dims, {torch::kBool, torch::kByte});
    if (t.scalar_type() == torch::kByte && t.gt(1).any().item<bool>()) fail(name, "mask values must be 0 or 1");
    return t.to(torch::kBool);
  }

 private:
  std::string path_;
  SafetensorsFile file_;
};

}  // namespace

namespace {

// read_batch and read_observation_batch: the observation tensors always; actions, noise and time required when
// `targets` is set, else each read only when the file has it.
Pi05Batch read_batch_file(const std::string& path, const Pi05Config& cfg, bool targets) {
  BatchReader r(path);
  const auto floats = {torch::kFloat32, torch::kBFloat16, torch::kFloat16};
  Pi05Batch b;
  b.images = r.get("images", 5, floats).to(torch::kFloat32);
  const int64_t B = b.images.size(0), slots = b.images.size(1), side = cfg.vision.image;
  r.expect_shape("images", b.images, {B, slots, 3, side, side});
  b.image_masks = r.mask("image_masks", 2);
  r.expect_shape("image_masks", b.image_masks, {B, slots});
  b.tokens = r.get("tokens", 2, {torch::kLong, torch::kInt}).to(torch::kLong);
  const int64_t L = b.tokens.size(1);
  r.expect_shape("tokens", b.tokens, {B, L});
  if (b.tokens.numel() > 0 &&
      (b.tokens.min().item<int64_t>() < 0 || b.tokens.max().item<int64_t>() >= cfg.backbone.vocab))
    r.fail("tokens", "token ids must lie in [0, " + std::to_string(cfg.backbone.vocab) + ")");
  b.token_masks = r.mask("token_masks", 2);
  r.expect_shape("token_masks", b.token_masks, {B, L});
  int64_t H = -1;  // from the first of actions / noise present
  if (targets || r.has("actions")) {
    b.actions = r.get("actions", 3, floats).to(torch::kFloat32);
    H = b.actions.size(1);
    r.expect_shape("actions", b.actions, {B, H, cfg.action_dim});
  }
  if (targets || r.has("noise")) {
    b.noise = r.get("noise", 3, floats).to(torch::kFloat32);
    if (H < 0) H = b.noise.size(1);
    r.expect_shape("noise", b.noise, {B, H, cfg.action_dim});
  }
  if (targets || r.has("time")) {
    b.time = r.get("time", 1, floats).to(torch::kFloat32);
    r.expect_shape("time", b.time, {B});
    if (b.time.numel() > 0 && (b.time.min().item<float>() < 0.f || b.time.max().item<float>() > 1.f))
      r.fail("time", "flow-matching time must lie in [0, 1]");
  }
  return b;
}

}  // namespace

Pi05Batch read_batch(const std::string& path, const Pi05Config& cfg) {
  return read_batch_file(path, cfg, /*targets=*/true);
}

Pi05Batch read_observation_batch(const std::string& path, const Pi05Config& cfg) {
  return read_batch_file(path, cfg, /*targets=*/false);
}

void write_batch(const std::string& path, const Pi05Batch& batch) {
  write_safetensors(path, {{"images", batch.images.to(torch::kFloat32)},
                           {"image_masks", batch.image_masks.to(torch::kBool)},
                           {"tokens", batch.tokens.to(torch::kLong)},
                           {"token_masks", batch.token_masks.to(torch::kBool)},
                           {"actions", batch.actions.to(torch::kFloat32)},
                           {"noise", batch.noise.to(torch::kFloat32)},
                           {"time", batch.time.to(torch::kFloat32)}});
}

}  // namespace vlatune::model
