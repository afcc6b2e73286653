#include "trainer/loader.h"

#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <stdexcept>

#include "trainer/image_preprocess.h"
#include "trainer/rng.h"

namespace vlatune::trainer {

DatasetLoader::DatasetLoader(std::shared_ptr<const Dataset> dataset, const model::Pi05Config& cfg, int64_t batch,
                             uint64_t seed, torch::Device device, const LoaderOptions& options)
    : dataset_(std::move(dataset)),
      cfg_(cfg),
      batch_(batch),
      seed_(seed),
      device_(concrete_device(device)),
      options_(options),
      horizon_(options.horizon > 0 ? options.horizon : dataset_->layout().horizon),
      gen_(make_data_generator(device_, seed)) {
  const auto& m = dataset_->manifest();
  const auto& l = m.layout;
  auto fail = [&](const std::string& why) { throw std::invalid_argument("dataset " + dataset_->dir() + ": " + why); };
  if (batch_ < 1) fail("batch must be >= 1");
  if (options_.workers < 1 || options_.prefetch < 1) fail("need at least one worker and a prefetch depth >= 1");
  if (m.tokenizer.vocab_size > cfg_.backbone.vocab)
    fail("token ids go up to " + std::to_string(m.tokenizer.vocab_size - 1) + " but the model's vocabulary has " +
         std::to_string(cfg_.backbone.vocab) + " entries (a dataset for a bigger model?)");
  if (l.cameras > options_.slots)
    fail(std::to_string(l.cameras) + " cameras do not fit " + std::to_string(options_.slots) + " image slots");
  if (horizon_ > l.horizon)
    fail("horizon " + std::to_string(horizon_) + " asked, the dataset stores chunks of " + std::to_string(l.horizon));
  if (l.action_dim > cfg_.action_dim)
    fail(std::to_string(l.action_dim) + " action dims exceed the model's " + std::to_string(cfg_.action_dim));
  for (const auto& name : m.cameras) wrist_.push_back(name.find("wrist") != std::string::npos);
  std::string checksums;
  for (const auto& s : m.shards) checksums += s.checksum;
  fingerprint_ = format_checksum(xxh64(checksums.data(), checksums.size()));

  // Page-locked slots make the host-to-device copies truly asynchronous; pinning needs a CUDA context, so only
  // when the batches go to a GPU.
  const bool pin = options_.pin_memory && device_.is_cuda();
  auto host = [pin](torch::Dtype t) { return torch::TensorOptions().dtype(t).pinned_memory(pin); };
  slots_.resize(static_cast<size_t>(options_.prefetch) + 1);  // prefetch ready/filling + 1 in its device copy
  for (size_t i = 0; i < slots_.size(); ++i) {
    auto& s = slots_[i];
    s.images = torch::empty({batch_, l.cameras, l.image_side, l.image_side, 3}, host(torch::kByte));
    s.tokens = torch::empty({batch_, l.text_len}, host(torch::kInt));
    s.lengths = torch::empty({batch_}, host(torch::kInt));
    s.actions = torch::empty({batch_, horizon_, l.action_dim}, host(torch::kFloat32));
    free_.push_back(static_cast<int>(i));
  }
  for (int w = 0; w < options_.workers; ++w) workers_.emplace_back([this] { worker_loop(); });
}

DatasetLoader::~DatasetLoader() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  work_cv_.notify_all();
  ready_cv_.notify_all();
  for (auto& w : workers_) w.join();
  // A slot may still be the source of an in-flight copy: wait before its memory is freed.
  for (auto& s : slots_)
    if (s.copied) s.copied->synchronize();
}

std::shared_ptr<const std::vector<int64_t>> DatasetLoader::epoch_order(int64_t epoch) const {
  std::lock_guard<std::mutex> lock(order_mutex_);
  auto it = orders_.find(epoch);
  if (it != orders_.end()) return it->second;
  // Fisher-Yates with the epoch's own stream. At most a few epochs are live (the prefetch window spans one
  // boundary at a time), so keep the last four and drop older ones.
  const int64_t n = dataset_->size();
  auto order = std::make_shared<std::vector<int64_t>>(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) (*order)[i] = i;
  SplitMix64 rng(derive_seed(seed_, RngStream::kEpochOrder, static_cast<uint64_t>(epoch)));
  for (int64_t j = n - 1; j > 0; --j) std::swap((*order)[j], (*order)[rng.uniform_int(0, j)]);
  orders_[epoch] = order;
  while (orders_.size() > 4) orders_.erase(orders_.begin());
  return order;
}

int64_t DatasetLoader::sample_index(int64_t step, int64_t i) const {
  const int64_t p = step * batch_ + i, n = dataset_->size();
  return (*epoch_order(p / n))[p % n];
}

void DatasetLoader::fill(HostSlot& slot, int64_t step) {
  const auto& l = dataset_->layout();
  auto* images = slot.images.data_ptr<uint8_t>();
  auto* tokens = slot.tokens.data_ptr<int32_t>();
  auto* lengths = slot.lengths.data_ptr<int32_t>();
  auto* actions = slot.actions.data_ptr<float>();
  const int64_t image_bytes = l.cameras * l.image_bytes();  // all cameras are adjacent in a record
  const int64_t action_values = horizon_ * l.action_dim;    // the first horizon_ rows of the stored chunk
  for (int64_t i = 0; i < batch_; ++i) {
    const int64_t idx = sample_index(step, i);
    const uint8_t* rec = dataset_->record(idx);
    std::memcpy(images + i * image_bytes, rec + l.images_offset(), image_bytes);
    std::memcpy(tokens + i * l.text_len, rec + l.tokens_offset(), 4 * l.text_len);
    std::memcpy(lengths + i, rec + l.token_len_offset(), 4);
    std::memcpy(actions + i * action_values, rec + l.actions_offset(), 4 * action_values);
  }
}

void DatasetLoader::worker_loop() {
  for (;;) {
    int64_t step;
    int slot_index;
    uint64_t generation;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      const int64_t stride = options_.step_stride;  // data-parallel ranks read every world_size-th step
      work_cv_.wait(
          lock, [&] { return stop_ || (!free_.empty() && next_claim_ < consume_step_ + options_.prefetch * stride); });
      if (stop_) return;
      step = next_claim_;
      next_claim_ += stride;
      slot_index = free_.front();
      free_.pop_front();
      generation = generation_;
    }
    HostSlot& slot = slots_[slot_index];
    if (slot.copied) slot.copied->synchronize();  // its previous batch's device copy must have read it
    slot.error = nullptr;
    try {
      fill(slot, step);
    } catch (...) {
      slot.error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (generation == generation_) {
        ready_[step] = slot_index;
      } else {
        free_.push_back(slot_index);  // a restart made this step stale
      }
    }
    ready_cv_.notify_all();
    work_cv_.notify_all();
  }
}

void DatasetLoader::restart_at(int64_t step) {
  ++generation_;
  for (const auto& r : ready_) free_.push_back(r.second);
  ready_.clear();
  consume_step_ = step;
  next_claim_ = step;
}

model::Pi05Batch DatasetLoader::next(int64_t step, double* wait_ms) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  int slot_index;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (step != consume_step_) restart_at(step);  // a jump (resume, evaluation): prefetch from here on
    work_cv_.notify_all();
    ready_cv_.wait(lock, [&] { return ready_.count(step) > 0; });
    slot_index = ready_[step];
    ready_.erase(step);
    consume_step_ = step + options_.step_stride;
  }
  work_cv_.notify_all();
  if (wait_ms != nullptr) *wait_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();

  HostSlot& slot = slots_[slot_index];
  // The slot goes back on every exit, exceptions included, or the workers would run out of slots.
  struct GiveBack {
    DatasetLoader* self;
    int index;
    ~GiveBack() {
      {
        std::lock_guard<std::mutex> lock(self->mutex_);
        self->free_.push_back(index);
      }
      self->work_cv_.notify_all();
    }
  } give_back{this, slot_index};
  if (slot.error) std::rethrow_exception(slot.error);

  // Device side. On the CPU `.to(kCPU)` aliases the slot, so every tensor below is a fresh one computed before
  // the slot goes back; on CUDA the slot is read only by the copies, which the event below fences.
  const auto& l = dataset_->layout();
  const auto i64 = torch::TensorOptions().dtype(torch::kLong).device(device_);
  model::Pi05Batch b;
  auto images = slot.images.to(device_, /*non_blocking=*/true);
  auto tokens = slot.tokens.to(device_, /*non_blocking=*/true);
  auto lengths = slot.lengths.to(device_, /*non_blocking=*/true);
  auto actions = slot.actions.to(device_, /*non_blocking=*/true);
  if (device_.is_cuda()) {
    c10::impl::VirtualGuardImpl guard(device_.type());
    if (!slot.copied) slot.copied.emplace(device_.type());  // one event per slot, re-recorded every use
    slot.copied->record(guard.getStream(device_));
  }

  std::vector<CameraAugment> aug;
  if (options_.augment)
    aug = draw_augmentation(derive_seed(seed_, RngStream::kAugment, static_cast<uint64_t>(step)), wrist_,
                            cfg_.vision.image);
  b.images = preprocess_images(images, cfg_.vision.image, options_.slots, options_.augment ? &aug : nullptr);
  b.image_masks = (torch::arange(options_.slots, i64) < l.cameras).unsqueeze(0).expand({batch_, options_.slots});
  b.image_masks = b.image_masks.contiguous();
  b.token_masks = torch::arange(l.text_len, i64).unsqueeze(0) < lengths.to(torch::kLong).unsqueeze(1);
  // Stored padding is already 0; the multiply keeps the batch contract even for a hand-edited dataset.
  b.tokens = tokens.to(torch::kLong) * b.token_masks.to(torch::kLong);
  b.actions = torch::zeros({batch_, horizon_, cfg_.action_dim}, actions.options());
  b.actions.narrow(2, 0, l.action_dim).copy_(actions);
  // The masks' summary from the host copy (the slot is ours until give_back), so the shortcuts read nothing back.
  b.used_slots.emplace();
  for (int64_t s = 0; s < options_.slots; ++s) b.used_slots->push_back(s < l.cameras);
  const int32_t* host_lengths = slot.lengths.data_ptr<int32_t>();
  int64_t longest = 0, tokens_total = 0;
  for (int64_t i = 0; i < batch_; ++i) {
    const int64_t length = std::min<int64_t>(l.text_len, host_lengths[i]);
    longest = std::max(longest, length);
    tokens_total += std::max<int64_t>(0, length);
  }
  b.text_used = longest;
  b.valid_images = batch_ * std::min<int64_t>(l.cameras, options_.slots);
  b.valid_tokens = tokens_total;
  {
    std::lock_guard<std::mutex> lock(gen_.mutex());
    gen_.set_current_seed(derive_seed(seed_, RngStream::kNoiseTime, static_cast<uint64_t>(step)));
  }
  draw_noise_and_time(batch_, horizon_, cfg_.action_dim, gen_, device_, b);
  return b;
}

DataPosition DatasetLoader::position() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return {seed_, consume_step_, fingerprint_};
}

int64_t DatasetLoader::text_len() const {
  return dataset_->layout().text_len;
}

std::string DatasetLoader::describe() const {
  const auto& l = dataset_->layout();
  return "dataset " + dataset_->dir() + ": " + std::to_string(dataset_->size()) + " samples, " +
         std::to_string(l.cameras) + " cameras at " + std::to_string(l.image_side) + " px -> " +
         std::to_string(cfg_.vision.image) + ", horizon " + std::to_string(horizon_) + ", " +
         std::to_string(options_.workers) + " workers, prefetch " + std::to_string(options_.prefetch) +
         (options_.augment ? ", augmentation on" : "");
}

}  // namespace vlatune::trainer
