#include "trainer/synthetic.h"

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "formats/file_io.h"
#include "trainer/rng.h"

namespace vlatune::trainer {

namespace {

void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("synthetic data: " + what);
}

// openpi's slot names (spec §5.1); LIBERO fills the first two.
std::vector<std::string> camera_names(int64_t cameras) {
  const char* names[] = {"base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb"};
  std::vector<std::string> out;
  for (int64_t c = 0; c < cameras; ++c) out.push_back(c < 3 ? names[c] : "camera_" + std::to_string(c));
  return out;
}

}  // namespace

std::pair<int64_t, int64_t> parse_prompt_range(const std::string& text) {
  const size_t colon = text.find(':');
  try {
    if (colon == std::string::npos) throw std::invalid_argument("no colon");
    size_t used_lo = 0, used_hi = 0;
    const int64_t lo = std::stoll(text.substr(0, colon), &used_lo);
    const int64_t hi = std::stoll(text.substr(colon + 1), &used_hi);
    if (used_lo != colon || used_hi != text.size() - colon - 1) throw std::invalid_argument("trailing text");
    if (lo < 0 || lo > hi) throw std::invalid_argument("not 0 <= MIN <= MAX");
    return {lo, hi};
  } catch (const std::logic_error&) {
    throw std::invalid_argument("prompt length range: expected MIN:MAX with 0 <= MIN <= MAX (e.g. 20:199), got \"" +
                                text + "\"");
  }
}

DatasetManifest write_synthetic_dataset(const SynthOptions& o) {
  const auto cfg = model::Pi05Config::named(o.config);
  require(o.samples >= 1, "samples must be >= 1, got " + std::to_string(o.samples));
  require(o.text_len >= 1, "text length must be >= 1");
  require(0 <= o.min_prompt && o.min_prompt <= o.max_prompt && o.max_prompt <= o.text_len,
          "prompt lengths need 0 <= MIN <= MAX <= " + std::to_string(o.text_len) + ", got " +
              std::to_string(o.min_prompt) + ":" + std::to_string(o.max_prompt));
  require(o.horizon >= 1, "horizon must be >= 1, got " + std::to_string(o.horizon));
  require(!o.out.empty(), "an output directory is required");

  DatasetManifest m;
  m.layout = RecordLayout{o.cameras, cfg.vision.image, o.text_len, o.horizon, o.action_dim, o.state_dim};
  m.layout.validate();
  m.cameras = camera_names(o.cameras);
  m.tokenizer.kind = "synthetic";
  m.tokenizer.vocab_size = cfg.backbone.vocab;
  m.norm.actions = {std::vector<float>(o.action_dim, -1.0f), std::vector<float>(o.action_dim, 1.0f)};
  m.norm.state = {std::vector<float>(o.state_dim, -1.0f), std::vector<float>(o.state_dim, 1.0f)};
  m.source = {
      {"kind", "synthetic"}, {"config", o.config}, {"seed", o.seed}, {"prompt_len", {o.min_prompt, o.max_prompt}}};

  // Before any byte is written: a dataset that fills the disk half way is a failed run with a mess to clean up.
  const auto& l = m.layout;
  const int64_t per_shard = std::max<int64_t>(1, o.shard_bytes / l.record_bytes());
  const int64_t shards = (o.samples + per_shard - 1) / per_shard;
  formats::require_free_space(o.out, static_cast<uint64_t>(o.samples * l.record_bytes() + shards * kShardHeaderBytes),
                              "a dataset of " + std::to_string(o.samples) + " samples");
  DatasetWriter writer(o.out, m, o.samples, o.shard_bytes);
  std::vector<int32_t> tokens(l.text_len);
  std::vector<float> actions(l.horizon * l.action_dim), state(l.state_dim);
  std::vector<std::vector<uint8_t>> images(l.cameras, std::vector<uint8_t>(l.image_bytes()));
  SampleView view;
  for (const auto& img : images) view.images.push_back(img.data());
  view.tokens = tokens.data();
  view.actions = actions.data();
  view.state = state.data();
  for (int64_t i = 0; i < o.samples; ++i) {
    SplitMix64 rng(derive_seed(o.seed, RngStream::kSynthSample, static_cast<uint64_t>(i)));
    view.token_len = static_cast<int32_t>(rng.uniform_int(o.min_prompt, o.max_prompt));
    for (int64_t t = 0; t < l.text_len; ++t)
      tokens[t] = t < view.token_len ? static_cast<int32_t>(rng.uniform_int(1, cfg.backbone.vocab - 1)) : 0;
    for (float& a : actions) a = static_cast<float>(rng.uniform(-1.0, 1.0));
    for (float& s : state) s = static_cast<float>(rng.uniform(-1.0, 1.0));
    normalize_quantile(actions.data(), l.horizon, l.action_dim, m.norm.actions);
    normalize_quantile(state.data(), 1, l.state_dim, m.norm.state);
    for (auto& img : images) rng.fill_bytes(img.data(), l.image_bytes());
    writer.append(view);
  }
  return writer.finish();
}

SyntheticSource::SyntheticSource(const model::Pi05Config& cfg, int64_t batch, uint64_t seed, torch::Device device,
                                 const LoaderOptions& options)
    : cfg_(cfg),
      batch_(batch),
      seed_(seed),
      device_(concrete_device(device)),
      options_(options),
      horizon_(options.horizon > 0 ? options.horizon : options.synthetic_horizon),
      gen_(make_data_generator(device_, seed)) {
  const auto& o = options_;
  require(batch_ >= 1, "batch must be >= 1");
  require(o.synthetic_cameras >= 0 && o.synthetic_cameras <= o.slots,
          "cameras (" + std::to_string(o.synthetic_cameras) + ") must fit the slots (" + std::to_string(o.slots) + ")");
  require(0 <= o.synthetic_min_prompt && o.synthetic_min_prompt <= o.synthetic_max_prompt &&
              o.synthetic_max_prompt <= o.synthetic_text_len,
          "prompt lengths need 0 <= MIN <= MAX <= text length");
  require(horizon_ >= 1, "horizon must be >= 1");
  require(o.synthetic_action_dim >= 1 && o.synthetic_action_dim <= cfg_.action_dim,
          "action dims must be in 1.." + std::to_string(cfg_.action_dim));
}

model::Pi05Batch SyntheticSource::next(int64_t step, double* wait_ms) {
  // Everything below is enqueued on the device: no host loop, no copy, no sync. Re-seeding per step makes the
  // batch a function of (seed, step) alone, so resuming at any step reproduces it.
  const auto& o = options_;
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(device_);
  const auto i64 = torch::TensorOptions().dtype(torch::kLong).device(device_);
  const int64_t side = cfg_.vision.image, slots = o.slots, text_len = o.synthetic_text_len;
  {
    std::lock_guard<std::mutex> lock(gen_.mutex());
    gen_.set_current_seed(derive_seed(seed_, RngStream::kSyntheticBatch, static_cast<uint64_t>(step)));
  }
  model::Pi05Batch b;
  b.image_masks = (torch::arange(slots, i64) < o.synthetic_cameras).unsqueeze(0).expand({batch_, slots}).contiguous();
  b.used_slots.emplace();
  for (int64_t s = 0; s < slots; ++s) b.used_slots->push_back(s < o.synthetic_cameras);
  // text_used and valid_tokens stay unset: the prompt lengths are drawn on the device.
  b.valid_images = batch_ * std::min<int64_t>(o.synthetic_cameras, slots);
  b.images = torch::empty({batch_, slots, 3, side, side}, f32).uniform_(-1.0, 1.0, gen_);
  if (o.synthetic_cameras < slots)
    b.images.narrow(1, o.synthetic_cameras, slots - o.synthetic_cameras).fill_(-1.0);  // empty camera
  auto lengths = torch::randint(o.synthetic_min_prompt, o.synthetic_max_prompt + 1, {batch_}, gen_, i64);
  b.token_masks = torch::arange(text_len, i64).unsqueeze(0) < lengths.unsqueeze(1);
  b.tokens = torch::randint(1, cfg_.backbone.vocab, {batch_, text_len}, gen_, i64) * b.token_masks.to(torch::kLong);
  b.actions = torch::zeros({batch_, horizon_, cfg_.action_dim}, f32);
  b.actions.narrow(2, 0, o.synthetic_action_dim).uniform_(-1.0, 1.0, gen_);
  {
    std::lock_guard<std::mutex> lock(gen_.mutex());
    gen_.set_current_seed(derive_seed(seed_, RngStream::kNoiseTime, static_cast<uint64_t>(step)));
  }
  draw_noise_and_time(batch_, horizon_, cfg_.action_dim, gen_, device_, b);
  next_step_ = step + 1;
  if (wait_ms != nullptr) *wait_ms = 0.0;  // nothing to wait for: the draws are queued behind the last step
  return b;
}

DataPosition SyntheticSource::position() const {
  return {seed_, next_step_, "synthetic"};
}

int64_t SyntheticSource::text_len() const {
  return options_.synthetic_text_len;
}

std::string SyntheticSource::describe() const {
  return "synthetic (generated on " + device_.str() + ", " + std::to_string(options_.synthetic_cameras) +
         " cameras, prompts " + std::to_string(options_.synthetic_min_prompt) + ":" +
         std::to_string(options_.synthetic_max_prompt) + ", horizon " + std::to_string(horizon_) + ")";
}

}  // namespace vlatune::trainer
