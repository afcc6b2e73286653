// Where training batches come from: one interface, two implementations (SyntheticSource in synthetic.h,
// DatasetLoader in loader.h), picked by open_data_source from the `--data` value.
//
// Reproducibility contract: the batch of step k is a pure function of (seed, k) and the data. The sample order
// is a per-epoch permutation of the dataset drawn from the seed; augmentation, flow-matching noise and time are
// drawn from generators seeded by (seed, k). So a checkpoint only needs the next step index (DataPosition),
// and a resumed run sees exactly the batches a straight run sees.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <torch/torch.h>

#include "model/batch.h"
#include "model/config.h"

namespace vlatune::trainer {

struct LoaderOptions {
  int workers = 4;          // host threads reading records and filling batches
  int prefetch = 4;         // batches assembled ahead of the consumer (the bounded queue's depth)
  int64_t slots = 3;        // camera slots per batch: dataset cameras first, the rest masked (-1), spec §5.1
  bool augment = false;     // spec §10 training augmentation (openpi PyTorch variant); off by default
  int64_t horizon = 0;      // 0: the dataset's horizon; smaller: the first `horizon` steps of each stored chunk
  bool pin_memory = true;   // page-locked host batches when the device is CUDA (async copies)
  int64_t step_stride = 1;  // the caller reads steps s, s + stride, ... (data-parallel: the world size); prefetch
                            // follows that sequence
  // `--data synthetic` only (a dataset carries its own):
  int64_t synthetic_cameras = 2;
  int64_t synthetic_text_len = 200;
  int64_t synthetic_min_prompt = 20;
  int64_t synthetic_max_prompt = 199;
  int64_t synthetic_horizon = 50;
  int64_t synthetic_action_dim = 7;  // real dims; the rest of the model's 32 are zero
};

// What a checkpoint stores to resume the data stream.
struct DataPosition {
  uint64_t seed = 0;
  int64_t next_step = 0;    // the step whose batch comes next
  std::string fingerprint;  // "synthetic" or the dataset's shard checksums hashed: resume refuses other data
};

class DataSource {
 public:
  virtual ~DataSource();
  // The batch of `step` on the source's device. Steps are usually asked for in order (0, 1, 2, ...), which
  // keeps the prefetch queue full; any other step is allowed and restarts the prefetch there. `wait_ms`
  // (optional) receives how long this call blocked waiting for host-side data (0 when it was ready).
  virtual model::Pi05Batch next(int64_t step, double* wait_ms) = 0;
  virtual DataPosition position() const = 0;
  // One line for logs: "synthetic (device cuda:0)" or "dataset DIR: N samples, ...".
  virtual std::string describe() const = 0;
  // Token positions per sample (batches carry [B, text_len] ids): times the micro-batch, the most embedding rows one
  // forward can look up (GradBuckets' row-sparse bound for embed_tokens).
  virtual int64_t text_len() const = 0;
};

// `data` is "synthetic" or a dataset directory. `batch` >= 1. Throws std::invalid_argument for bad options,
// formats::FormatError for a corrupt or mismatched dataset (naming the file), before any step runs.
std::unique_ptr<DataSource> open_data_source(const std::string& data, const model::Pi05Config& cfg, int64_t batch,
                                             uint64_t seed, torch::Device device, const LoaderOptions& options);

// A generator of `device`'s type (CPU or CUDA), seeded. "cuda" without an index means the current device.
at::Generator make_data_generator(torch::Device device, uint64_t seed);
// `device` with an explicit index (cuda -> cuda:<current>), so generators and tensors agree.
torch::Device concrete_device(torch::Device device);

// Flow-matching draws of one batch (spec §7.1, as model::make_random_batch): noise ~ N(0, 1) [B, H, D] and
// time = 0.999 * Beta(1.5, 1) + 0.001 sampled as U^(1/1.5) * 0.999 + 0.001, [B], float32, on gen's device.
void draw_noise_and_time(int64_t batch, int64_t horizon, int64_t action_dim, at::Generator& gen, torch::Device device,
                         model::Pi05Batch& out);

}  // namespace vlatune::trainer
