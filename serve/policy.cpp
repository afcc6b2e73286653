#include "serve/policy.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "model/pi05.h"
#include "trainer/image_preprocess.h"
#include "trainer/image_resize.h"
#include "trainer/tokenizer.h"

namespace vlatune::serve {

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

const WireValue& require(const std::map<std::string, WireValue>& obs, const std::string& key, const char* what) {
  auto it = obs.find(key);
  if (it == obs.end()) {
    std::string present;
    for (const auto& item : obs) present += (present.empty() ? "" : ", ") + item.first;
    throw WireError("'" + key + "': missing (" + what +
                    "); the observation has: " + (present.empty() ? "no keys" : present));
  }
  return it->second;
}

template <typename T>
double element(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return static_cast<double>(v);
}

// Every element of a numeric array as a double (little-endian host).
std::vector<double> numbers_of(const NdArray& a) {
  char kind = 0;
  const int64_t bytes = dtype_item_bytes(a.dtype, &kind);
  std::vector<double> out(static_cast<size_t>(a.numel()));
  for (size_t i = 0; i < out.size(); ++i) {
    const char* p = a.data.data() + i * static_cast<size_t>(bytes);
    if (kind == 'f') {
      out[i] = bytes == 4 ? element<float>(p) : element<double>(p);
    } else if (kind == 'u' || kind == 'b') {
      out[i] = bytes == 1   ? element<uint8_t>(p)
               : bytes == 2 ? element<uint16_t>(p)
               : bytes == 4 ? element<uint32_t>(p)
                            : element<uint64_t>(p);
    } else {
      out[i] = bytes == 1   ? element<int8_t>(p)
               : bytes == 2 ? element<int16_t>(p)
               : bytes == 4 ? element<int32_t>(p)
                            : element<int64_t>(p);
    }
  }
  return out;
}

// openpi's _parse_image: uint8 as is, floats as (255 x).astype(uint8); [3, H, W] (first dim 3) -> [H, W, 3].
std::vector<uint8_t> image_hwc(const std::string& key, const WireValue& v, int64_t max_side, int64_t* h, int64_t* w) {
  const std::string expected = "expected an image: uint8 [H, W, 3] or [3, H, W] (or float in [0, 1])";
  if (v.kind != WireValue::Kind::kArray) throw WireError("'" + key + "': " + expected + ", got " + v.describe());
  const NdArray& a = v.array;
  char kind = 0;
  const int64_t bytes = dtype_item_bytes(a.dtype, &kind);
  const bool u8 = kind == 'u' && bytes == 1;
  if (a.shape.size() != 3 || !(u8 || kind == 'f'))
    throw WireError("'" + key + "': " + expected + ", got " + v.describe());
  const bool chw = a.shape[0] == 3;
  if (!chw && a.shape[2] != 3) throw WireError("'" + key + "': " + expected + ", got " + v.describe());
  *h = chw ? a.shape[1] : a.shape[0];
  *w = chw ? a.shape[2] : a.shape[1];
  if (*h < 1 || *w < 1 || *h > max_side || *w > max_side)
    throw WireError("'" + key + "': image sides must be in [1, " + std::to_string(max_side) + "], got " + v.describe());
  std::vector<double> values;
  if (!u8) values = numbers_of(a);
  std::vector<uint8_t> out(static_cast<size_t>(*h * *w * 3));
  for (int64_t y = 0; y < *h; ++y)
    for (int64_t x = 0; x < *w; ++x)
      for (int64_t c = 0; c < 3; ++c) {
        const int64_t src = chw ? (c * *h + y) * *w + x : (y * *w + x) * 3 + c;
        uint8_t value;
        if (u8) {
          value = static_cast<uint8_t>(a.data[static_cast<size_t>(src)]);
        } else {
          const double scaled = 255.0 * values[static_cast<size_t>(src)];
          value = static_cast<uint8_t>(std::clamp(scaled, 0.0, 255.0));  // truncates, as astype(uint8)
        }
        out[static_cast<size_t>((y * *w + x) * 3 + c)] = value;
      }
  return out;
}

}  // namespace

Policy::Policy(model::Pi05Impl& model, model::SampleOptions sample, trainer::NormStats norm,
               std::shared_ptr<const trainer::PromptTokenizer> tokenizer, PolicyConfig config)
    : model_(model),
      sample_options_(std::move(sample)),
      norm_(std::move(norm)),
      tokenizer_(std::move(tokenizer)),
      config_(std::move(config)),
      noise_gen_(at::detail::createCPUGenerator(config_.seed)) {
  const model::Pi05Config& cfg = model_.config();
  auto fail = [](const std::string& why) { throw std::invalid_argument("serve: " + why); };
  if (config_.camera_keys.empty()) fail("no camera key");
  if (static_cast<int64_t>(config_.camera_keys.size()) > config_.slots)
    fail(std::to_string(config_.camera_keys.size()) + " camera keys for " + std::to_string(config_.slots) +
         " image slots");
  if (static_cast<int64_t>(norm_.actions.q01.size()) > cfg.action_dim)
    fail("the norm stats have " + std::to_string(norm_.actions.q01.size()) + " action dims, the model " +
         std::to_string(cfg.action_dim));
  if (tokenizer_->vocab_size() > cfg.backbone.vocab)
    fail("the tokenizer's vocabulary (" + std::to_string(tokenizer_->vocab_size()) + ") exceeds the model's (" +
         std::to_string(cfg.backbone.vocab) + ")");
  if (config_.horizon < 1 || config_.text_len < 1) fail("horizon and text_len must be >= 1");
  sampler_ = std::make_unique<model::Sampler>(model_, sample_options_);
}

Policy::~Policy() = default;

nlohmann::json Policy::metadata() const {
  const model::Pi05Config& cfg = model_.config();
  return {{"policy", "pi05 (vlatune)"},          {"camera_keys", config_.camera_keys},
          {"state_key", config_.state_key},      {"prompt_key", config_.prompt_key},
          {"noise_key", config_.noise_key},      {"image_side", cfg.vision.image},
          {"state_dim", norm_.state.q01.size()}, {"action_dim", norm_.actions.q01.size()},
          {"action_horizon", config_.horizon},   {"num_steps", sample_options_.num_steps},
          {"max_token_len", config_.text_len},   {"discrete_state", config_.discrete_state}};
}

Policy::Actions Policy::infer(const std::map<std::string, WireValue>& obs) {
  const model::Pi05Config& cfg = model_.config();
  const int64_t side = cfg.vision.image, cams = static_cast<int64_t>(config_.camera_keys.size());
  const int64_t image_bytes = side * side * 3;

  // Images: resize_with_pad to the model's side, then the training pipeline's scaling.
  torch::Tensor pixels = torch::empty({1, cams, side, side, 3}, torch::kByte);
  for (int64_t c = 0; c < cams; ++c) {
    const std::string& key = config_.camera_keys[static_cast<size_t>(c)];
    int64_t h = 0, w = 0;
    const std::vector<uint8_t> hwc =
        image_hwc(key, require(obs, key, "a camera image"), config_.max_image_side, &h, &w);
    trainer::resize_with_pad(hwc.data(), h, w, side, pixels.data_ptr<uint8_t>() + c * image_bytes);
  }

  // State: quantile-normalized (it reaches the model only through a discrete-state prompt).
  const WireValue& state_value = require(obs, config_.state_key, "the robot state");
  const auto state_dims = static_cast<int64_t>(norm_.state.q01.size());
  if (state_value.kind != WireValue::Kind::kArray || state_value.array.shape.size() != 1 ||
      state_value.array.shape[0] != state_dims || state_value.array.dtype.size() < 2 ||
      state_value.array.dtype[1] == 'b')
    throw WireError("'" + config_.state_key + "': expected a numeric array [" + std::to_string(state_dims) +
                    "] (the norm stats' state dims), got " + state_value.describe());
  std::vector<float> state;
  for (double x : numbers_of(state_value.array)) state.push_back(static_cast<float>(x));
  trainer::normalize_quantile(state.data(), 1, state_dims, norm_.state);

  const WireValue& prompt = require(obs, config_.prompt_key, "the task instruction");
  if (prompt.kind != WireValue::Kind::kString)
    throw WireError("'" + config_.prompt_key + "': expected a string, got " + prompt.describe());
  const trainer::TokenizedPrompt tokens =
      tokenizer_->tokenize(prompt.text, config_.discrete_state ? state.data() : nullptr, state_dims);

  torch::Tensor noise;
  auto noise_it = obs.find(config_.noise_key);
  if (noise_it != obs.end()) {
    const WireValue& v = noise_it->second;
    if (v.kind != WireValue::Kind::kArray || v.array.dtype != "<f4" || v.array.shape.size() != 2 ||
        v.array.shape[1] != cfg.action_dim || v.array.shape[0] < 1 || v.array.shape[0] > 4096)
      throw WireError("'" + config_.noise_key + "': expected float32 [H, " + std::to_string(cfg.action_dim) +
                      "] (H <= 4096), got " + v.describe());
    noise = torch::empty({1, v.array.shape[0], cfg.action_dim}, torch::kFloat32);
    std::memcpy(noise.data_ptr<float>(), v.array.data.data(), v.array.data.size());
  } else {
    noise = torch::randn({1, config_.horizon, cfg.action_dim}, noise_gen_, torch::kFloat32);
  }

  const auto device = model_.action_in_proj->weight.device();
  model::Pi05Batch batch;
  // The uint8 pixels travel (a sixth of the float bytes); the scaling runs where the model does.
  batch.images = trainer::preprocess_images(pixels.to(device), side, config_.slots, nullptr);
  batch.image_masks = (torch::arange(config_.slots) < cams).unsqueeze(0).to(device);
  batch.tokens = torch::tensor(std::vector<int64_t>(tokens.ids.begin(), tokens.ids.end()), torch::kLong)
                     .view({1, config_.text_len})
                     .to(device);
  batch.token_masks = (torch::arange(config_.text_len) < tokens.length).unsqueeze(0).to(device);

  const auto t0 = Clock::now();
  torch::Tensor actions = sampler_->sample(batch, noise.to(device));
  actions = actions.to(torch::kCPU, torch::kFloat32).contiguous();  // waits for the device
  Actions out;
  out.infer_ms = ms_since(t0);
  out.horizon = actions.size(1);
  out.dims = static_cast<int64_t>(norm_.actions.q01.size());
  trainer::unnormalize_quantile(actions.data_ptr<float>(), out.horizon, cfg.action_dim, norm_.actions);
  const float* a = actions.data_ptr<float>();
  for (int64_t t = 0; t < out.horizon; ++t)
    out.values.insert(out.values.end(), a + t * cfg.action_dim, a + t * cfg.action_dim + out.dims);
  return out;
}

Response Policy::handle(const std::string& payload, double prev_total_ms) {
  const auto t0 = Clock::now();
  try {
    const auto obs = decode_message(payload.data(), payload.size());
    const Actions a = infer(obs);
    nlohmann::json server_timing = {{"infer_ms", ms_since(t0)}};
    if (prev_total_ms >= 0) server_timing["prev_total_ms"] = prev_total_ms;
    const nlohmann::json fields = {{"policy_timing", {{"infer_ms", a.infer_ms}}}, {"server_timing", server_timing}};
    return {true, encode_message(fields, {{"actions", float32_array(a.values.data(), a.horizon, a.dims)}})};
  } catch (const WireError& e) {
    return {false, std::string("vlatune serve: bad observation: ") + e.what()};
  }
}

}  // namespace vlatune::serve
