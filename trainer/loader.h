// DatasetLoader: the prefetching loader over a packed Dataset.
//
//   workers (host threads)                         consumer (the training loop, next(step))
//   claim step s < consumer + prefetch             wait for step s (timed: data_wait_ms)
//   take a free host slot (pinned on CUDA)         copy the slot to the device (non_blocking)
//   memcpy B records from the mmap into it         resize + scale (+ augment) on the device
//   publish "s is ready"                           noise/time from a generator seeded by (seed, s)
//                                                  record an event, give the slot back
// A slot is reused only after its device copy finished (the event), so no batch is overwritten in flight.
// Host work per batch is B memcpy's of one record each (uint8 images at the stored size, not floats at 224):
// a few MB per batch at LIBERO sizes, far below what one thread copies in a step time.
//
// Order: sample i of step s is position p = s * B + i of an endless stream of epochs; epoch e = p / N is a
// permutation of the dataset drawn from (seed, e). Batches therefore span epoch boundaries (no sample is
// dropped and every epoch is complete), and any step's batch can be rebuilt from (seed, step) alone.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <c10/core/Event.h>

#include "trainer/data_source.h"
#include "trainer/dataset.h"

namespace vlatune::trainer {

class DatasetLoader : public DataSource {
 public:
  // Checks the dataset against the model and options (vocabulary, cameras vs slots, horizon, action dims) and
  // starts the workers. Throws std::invalid_argument naming the dataset and the mismatch.
  DatasetLoader(std::shared_ptr<const Dataset> dataset, const model::Pi05Config& cfg, int64_t batch, uint64_t seed,
                torch::Device device, const LoaderOptions& options);
  ~DatasetLoader() override;  // stops and joins the workers

  model::Pi05Batch next(int64_t step, double* wait_ms) override;
  DataPosition position() const override;
  std::string describe() const override;
  int64_t text_len() const override;

  // The dataset index of sample `i` of step `step` (the order contract above; exposed for tests and tools).
  int64_t sample_index(int64_t step, int64_t i) const;
  int64_t horizon() const { return horizon_; }

 private:
  struct HostSlot {
    torch::Tensor images;              // [B, cameras, S, S, 3] uint8
    torch::Tensor tokens;              // [B, text_len] int32
    torch::Tensor lengths;             // [B] int32
    torch::Tensor actions;             // [B, horizon, action_dim] float32 (normalized, unpadded)
    std::optional<c10::Event> copied;  // recorded after the device copies read this slot (CUDA only)
    std::exception_ptr error;          // a worker's failure, rethrown by next()
  };

  void worker_loop();
  void fill(HostSlot& slot, int64_t step);
  std::shared_ptr<const std::vector<int64_t>> epoch_order(int64_t epoch) const;
  void restart_at(int64_t step);  // with mutex_ held

  std::shared_ptr<const Dataset> dataset_;
  model::Pi05Config cfg_;
  int64_t batch_;
  uint64_t seed_;
  torch::Device device_;
  LoaderOptions options_;
  int64_t horizon_;
  std::vector<bool> wrist_;
  std::string fingerprint_;
  at::Generator gen_;

  std::vector<HostSlot> slots_;
  mutable std::mutex mutex_;
  std::condition_variable work_cv_, ready_cv_;
  std::deque<int> free_;          // indices into slots_
  std::map<int64_t, int> ready_;  // step -> slot
  int64_t consume_step_ = 0;      // the step next() expects
  int64_t next_claim_ = 0;        // the next step a worker starts
  uint64_t generation_ = 0;       // bumped by a restart: older in-flight fills are discarded
  bool stop_ = false;
  std::vector<std::thread> workers_;

  mutable std::mutex order_mutex_;
  mutable std::map<int64_t, std::shared_ptr<const std::vector<int64_t>>> orders_;
};

}  // namespace vlatune::trainer
